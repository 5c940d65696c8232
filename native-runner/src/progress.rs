//! The prefill progress bar: tokens done of the prompt and the rate, on stderr when it is a
//! terminal (a log or a pipe gets nothing: the timings line says the same at the end).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use webshard::engine::OnPrefill;

/// A progress callback for `Engine::set_prefill_progress`, or None where no bar should show.
pub fn prefill_bar(quiet: bool) -> Option<Box<OnPrefill>> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    let style =
        ProgressStyle::with_template("prompt {bar:30} {pos}/{len} tokens {per_sec:.1} ETA {eta}")
            .expect("valid progress template");
    let mut bar: Option<ProgressBar> = None;
    Some(Box::new(move |done, total| {
        if done == 0 {
            let fresh = ProgressBar::new(total as u64).with_style(style.clone());
            fresh.tick();
            bar = Some(fresh);
        }
        if let Some(current) = &bar {
            current.set_position(done as u64);
            if done >= total {
                current.finish_and_clear();
                bar = None;
            }
        }
    }))
}
