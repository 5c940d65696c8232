//! The next token's mask, computed on a helper thread while the GPU computes the step (the
//! mask depends only on the tokens so far, the logits only on the model).

use std::thread::JoinHandle;

use super::constraint::{Constraint, ConstraintError, TokenMask};

/// A constraint and the mask it is computing.
pub struct MaskAhead {
    work: std::io::Result<JoinHandle<Masked>>,
}

/// A finished mask, the constraint it came from, and the CPU seconds it took.
pub struct Masked {
    pub constraint: Constraint,
    pub mask: Result<TokenMask, ConstraintError>,
    pub seconds: f64,
}

impl MaskAhead {
    /// Starts computing `constraint`'s next mask.
    pub fn start(constraint: Constraint) -> MaskAhead {
        let work = std::thread::Builder::new()
            .name("webshard-mask".into())
            .spawn(move || compute(constraint));
        MaskAhead { work }
    }

    /// The mask, once computed. `async` so the caller can join it with the GPU step.
    pub async fn finish(self) -> Result<Masked, ConstraintError> {
        let handle = self
            .work
            .map_err(|e| ConstraintError::Dead(format!("could not start the mask thread: {e}")))?;
        handle
            .join()
            .map_err(|_| ConstraintError::Dead("the mask computation panicked".into()))
    }
}

fn compute(mut constraint: Constraint) -> Masked {
    let started = web_time::Instant::now();
    let mask = constraint.allowed();
    Masked {
        constraint,
        mask,
        seconds: started.elapsed().as_secs_f64(),
    }
}
