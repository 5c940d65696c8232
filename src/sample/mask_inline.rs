//! The next token's mask in a browser: no threads, so it is computed when the caller awaits
//! it, which the engine does after submitting the GPU step (joined with it), so the CPU work
//! still overlaps the GPU's.

use super::constraint::{Constraint, ConstraintError, TokenMask};

/// A constraint whose next mask is wanted.
pub struct MaskAhead {
    constraint: Constraint,
}

/// A finished mask, the constraint it came from, and the CPU seconds it took.
pub struct Masked {
    pub constraint: Constraint,
    pub mask: Result<TokenMask, ConstraintError>,
    pub seconds: f64,
}

impl MaskAhead {
    pub fn start(constraint: Constraint) -> MaskAhead {
        MaskAhead { constraint }
    }

    pub async fn finish(self) -> Result<Masked, ConstraintError> {
        let mut constraint = self.constraint;
        let started = web_time::Instant::now();
        let mask = constraint.allowed();
        Ok(Masked {
            constraint,
            mask,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}
