// LFM2's gated short convolution, after in_proj has made B, C and x for each token
// (`bcx`, rows of 3 * CHANNELS: B, then C, then x):
//   y[t, c] = C[t, c] * sum_j w[c, j] * bx[p - (L - 1) + j, c]     p = start_pos + t
// with bx = B * x, causal (positions before 0 are zero). The sequence's state is `history`,
// bx of every earlier position ([pos][channel], like a KV cache), so a sequence can go back to
// any prefix. Each thread writes bx of its own (token, channel) into the history and reads
// there only positions before start_pos, which this dispatch never writes; positions of this
// call come from `bcx` itself, so one dispatch serves a prompt and a decode step alike.
// f32 in every variant: each element is computed once from a few products.

struct Params {
    tokens: u32,
    channels: u32,
    kernel_len: u32,
    start_pos: u32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> history: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn gated_input(token: u32, channel: u32) -> f32 {
    let row = token * 3u * params.channels;
    return bcx[row + channel] * bcx[row + 2u * params.channels + channel];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = (group.y * params.groups_x + group.x) * WG + lane;
    if (i >= params.tokens * params.channels) {
        return;
    }
    let token = i / params.channels;
    let channel = i % params.channels;
    let pos = params.start_pos + token;
    let taps = params.kernel_len;
    var acc = 0.0;
    for (var j = 0u; j < taps; j++) {
        // Position pos - (taps - 1) + j, skipped before the sequence starts.
        if (pos + j + 1u < taps) {
            continue;
        }
        let source = pos + j + 1u - taps;
        var value: f32;
        if (source >= params.start_pos) {
            value = gated_input(source - params.start_pos, channel);
        } else {
            value = history[source * params.channels + channel];
        }
        acc += weight[channel * taps + j] * value;
    }
    history[pos * params.channels + channel] = gated_input(token, channel);
    let gate = bcx[token * 3u * params.channels + params.channels + channel];
    out[i] = gate * acc;
}
