//! Deciding when generation stops: end-of-generation tokens and stop strings.
//!
//! Text is streamed: a stop string can arrive split over several tokens, so text that could
//! still turn out to be the start of a stop string is held back until it is either completed
//! (and dropped) or ruled out (and released).

use crate::tokenizer::{Tokenizer, Utf8Stream};

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration(u32),
    /// The output contained this stop string (it is not part of the released text).
    StopString(String),
}

/// What one step releases: text safe to show, and whether generation is over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStep {
    pub text: String,
    pub stop: Option<StopReason>,
}

/// Watches streamed output for end-of-generation tokens and stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopChecker {
    stops: Vec<String>,
    held: String,
    utf8: Utf8Stream,
    stopped: Option<StopReason>,
}

impl StopChecker {
    /// Empty stop strings are ignored.
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> StopChecker {
        StopChecker {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            ..StopChecker::default()
        }
    }

    /// Why generation stopped, once it has.
    pub fn stop_reason(&self) -> Option<&StopReason> {
        self.stopped.as_ref()
    }

    /// Feeds one generated token: stops at end-of-generation tokens, otherwise feeds its text.
    pub fn push_token(&mut self, tokenizer: &Tokenizer, id: u32) -> StopStep {
        if self.stopped.is_some() {
            return StopStep::default();
        }
        if tokenizer.is_eog(id) {
            let text = self.flush();
            self.stopped = Some(StopReason::EndOfGeneration(id));
            return StopStep {
                text,
                stop: self.stopped.clone(),
            };
        }
        let text = self.utf8.push(&tokenizer.token_bytes(id));
        self.push_text(&text)
    }

    /// Feeds generated text; releases what can no longer be part of a stop string.
    pub fn push_text(&mut self, text: &str) -> StopStep {
        if self.stopped.is_some() {
            return StopStep::default();
        }
        self.held.push_str(text);
        if let Some((start, stop)) = self.earliest_stop() {
            let released = self.held[..start].to_owned();
            self.held.clear();
            self.stopped = Some(StopReason::StopString(stop));
            return StopStep {
                text: released,
                stop: self.stopped.clone(),
            };
        }
        let keep_from = self.partial_stop_start();
        let released = self.held[..keep_from].to_owned();
        self.held.drain(..keep_from);
        StopStep {
            text: released,
            stop: None,
        }
    }

    /// Releases everything held back (call when generation ends for another reason).
    pub fn flush(&mut self) -> String {
        let tail = self.utf8.finish();
        self.held.push_str(&tail);
        std::mem::take(&mut self.held)
    }

    /// The leftmost complete stop string in the held text (longest on a tie).
    fn earliest_stop(&self) -> Option<(usize, String)> {
        self.stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()).map(|at| (at, stop)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))
            .map(|(at, stop)| (at, stop.clone()))
    }

    /// Where the longest held suffix that begins some stop string starts (`len` if none).
    fn partial_stop_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let earliest = self.held.len().saturating_sub(longest);
        self.held
            .char_indices()
            .map(|(i, _)| i)
            .filter(|&i| i >= earliest)
            .find(|&i| {
                let suffix = &self.held[i..];
                self.stops.iter().any(|stop| stop.starts_with(suffix))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_pushes_is_held_then_dropped() {
        let mut s = StopChecker::new(["</end>"]);
        assert_eq!(s.push_text("Hello </").text, "Hello ");
        assert_eq!(s.push_text("en").text, "");
        let step = s.push_text("d> trailing");
        assert_eq!(step.text, "");
        assert_eq!(step.stop, Some(StopReason::StopString("</end>".into())));
        assert_eq!(s.push_text("more").text, "", "nothing after a stop");
    }

    #[test]
    fn false_start_is_released() {
        let mut s = StopChecker::new(["STOP"]);
        assert_eq!(s.push_text("ST").text, "");
        assert_eq!(s.push_text("AR").text, "STAR");
        assert_eq!(s.push_text("S").text, "");
        assert_eq!(s.flush(), "S");
    }

    #[test]
    fn earliest_stop_wins_and_text_before_it_is_released() {
        let mut s = StopChecker::new(["bb", "ab"]);
        let step = s.push_text("xabb");
        assert_eq!(step.text, "x");
        assert_eq!(step.stop, Some(StopReason::StopString("ab".into())));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        let mut s = StopChecker::new(["éx"]);
        assert_eq!(s.push_text("aé").text, "a");
        assert_eq!(s.push_text("é").text, "é");
        assert_eq!(s.flush(), "é");
    }
}
