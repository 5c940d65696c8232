//! A batched sequence's constraint (JSON, a schema, a grammar, a tool call): the scheduler's
//! rows may each have one. Its next mask is computed on a helper thread while the GPU
//! computes the step (`MaskAhead`, as the engine's own constrained path does), then applied
//! to the row's logits before its sampler picks.

use webshard::sample::{Constraint, ConstraintError, MaskAhead};

pub struct RowConstraint {
    /// The next mask being computed; `None` once the constraint is complete.
    ahead: Option<MaskAhead>,
    /// CPU seconds the masks took.
    pub seconds: f64,
}

impl RowConstraint {
    /// Starts computing the first mask (it runs during the prompt's prefill).
    pub fn start(constraint: Constraint) -> RowConstraint {
        RowConstraint {
            ahead: Some(MaskAhead::start(constraint)),
            seconds: 0.0,
        }
    }

    /// Masks `logits` to the allowed tokens, lets `pick` choose among them and commits the
    /// choice; returns it and whether the output is now complete. The next mask starts at
    /// once, to be ready by the next step.
    pub async fn pick(
        &mut self,
        logits: &mut [f32],
        pick: impl FnOnce(&[f32]) -> u32,
    ) -> Result<(u32, bool), ConstraintError> {
        let ahead = self.ahead.take().ok_or_else(|| {
            ConstraintError::Dead("a token was asked for after the output was complete".into())
        })?;
        let masked = ahead.finish().await?;
        self.seconds += masked.seconds;
        masked.mask?.apply(logits);
        let id = pick(logits);
        let mut constraint = masked.constraint;
        constraint.commit(id)?;
        let complete = constraint.is_complete();
        if !complete {
            self.ahead = Some(MaskAhead::start(constraint));
        }
        Ok((id, complete))
    }
}
