//! A fleet request's constraint on the coordinator: the engine's machinery (llguidance via
//! `sample::Constraint`), with each step's allowed set sent down the chain in the `Forward`
//! so that the last stage picks among those tokens before it replies.

use web_time::Instant;

use super::super::allowed::AllowedTokens;
use super::super::transport::Transport;
use super::coordinator::Coordinator;
use super::RoleError;
use crate::front::GenerateRequest;
use crate::sample::{Constraint, ConstraintError, TokenView};

pub(super) struct Constrained {
    constraint: Constraint,
    /// The allowed set of the step awaited, kept so that a replay sends the same one.
    allowed: Option<AllowedTokens>,
    /// CPU seconds spent computing masks.
    pub mask_seconds: f64,
}

impl Constrained {
    pub fn new(constraint: Constraint) -> Constrained {
        Constrained {
            constraint,
            allowed: None,
            mask_seconds: 0.0,
        }
    }

    /// The tokens allowed next, over the model's `vocab_size` ids.
    pub fn allowed(&mut self, vocab_size: u32) -> Result<AllowedTokens, ConstraintError> {
        if let Some(allowed) = &self.allowed {
            return Ok(allowed.clone());
        }
        let started = Instant::now();
        let mask = self.constraint.allowed()?;
        let allowed = AllowedTokens::from_mask(&mask, vocab_size);
        self.mask_seconds += started.elapsed().as_secs_f64();
        self.allowed = Some(allowed.clone());
        Ok(allowed)
    }

    /// Consumes the chosen token; returns whether the output is complete.
    pub fn commit(&mut self, id: u32) -> Result<bool, ConstraintError> {
        self.allowed = None;
        self.constraint.commit(id)?;
        Ok(self.constraint.is_complete())
    }
}

impl<T: Transport> Coordinator<T> {
    /// The request's constraint compiled against the model's vocabulary (`None` without
    /// one), so that a bad schema, regex or grammar is refused before any step.
    pub(super) fn compile_constraint(
        &mut self,
        request: &GenerateRequest,
    ) -> Result<Option<Constrained>, RoleError> {
        let Some(spec) = &request.options.constraint else {
            return Ok(None);
        };
        if self.token_view.is_none() {
            self.token_view = Some(TokenView::new(&self.text.tokenizer)?);
        }
        let view = self.token_view.as_ref().expect("just built");
        Ok(Some(Constrained::new(Constraint::new(view, spec)?)))
    }
}
