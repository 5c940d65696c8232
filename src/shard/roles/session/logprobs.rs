//! Log-probabilities of a chain's tokens: the last stage's candidates (`StageOutput::TopK`)
//! carry their logits and the log-sum-exp over the whole vocabulary, so a token's
//! log-probability is its logit minus that sum, as on one device.

use super::super::super::frame::StageOutput;
use super::super::RoleError;
use super::Active;
use crate::front::TokenLogprobs;

/// Adds token `id`'s log-probabilities, from the last stage's candidates, to a request that
/// asked for them. The token is always a candidate: it was sampled (or is the greedy one)
/// among them.
pub(super) fn record_logprobs(
    active: &mut Active,
    output: &StageOutput,
    id: u32,
) -> Result<(), RoleError> {
    let Some((top, choices)) = active.logprobs.as_mut() else {
        return Ok(());
    };
    let StageOutput::TopK {
        ids,
        logits,
        log_norm: Some(log_norm),
    } = output
    else {
        return Err(RoleError::Invalid(
            "the last stage sent no normalised candidates for a request that asked for \
             log-probabilities"
                .into(),
        ));
    };
    let logprob = |logit: f32| logit - log_norm;
    let chosen = ids.iter().position(|&candidate| candidate == id);
    choices.push(TokenLogprobs {
        id,
        logprob: chosen.map_or(f32::NEG_INFINITY, |at| logprob(logits[at])),
        top: (ids.iter().zip(logits))
            .take(*top as usize)
            .map(|(&candidate, &logit)| (candidate, logprob(logit)))
            .collect(),
    });
    Ok(())
}
