// What every attention kernel masks the same way: the sliding window, logit soft-capping, and
// the stand-in score of no key.

// Stands for "no key yet": finite, so exp(NEG - NEG) is 1 rather than NaN.
const NEG: f32 = -1.0e30;

// The first key the query at `pos` sees; `window` is u32 max when there is no sliding window.
fn first_visible(pos: u32, window: u32) -> u32 {
    return select(0u, pos + 1u - window, pos + 1u > window);
}

// tanh soft-capping of a logit when `softcap` > 0.
fn capped(score: f32, softcap: f32) -> f32 {
    if (softcap > 0.0) {
        return softcap * tanh(score / softcap);
    }
    return score;
}
