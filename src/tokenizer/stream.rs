//! Streaming detokenization: byte-level tokens can end inside a UTF-8 character, so text is
//! released only up to the last complete character.

/// Accumulates token bytes and hands out the complete UTF-8 text so far.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Utf8Stream {
        Utf8Stream::default()
    }

    /// Adds bytes; returns the text that is now complete. Bytes that can never become valid
    /// UTF-8 are replaced with U+FFFD right away; a possibly unfinished tail is held back.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(all) => {
                    text.push_str(all);
                    self.pending.clear();
                    return text;
                }
                Err(err) => {
                    let valid = err.valid_up_to();
                    // Checked by from_utf8 above.
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match err.error_len() {
                        Some(bad) => {
                            text.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                    }
                }
            }
        }
    }

    /// Flushes whatever is held back (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_split_characters_until_complete() {
        let mut s = Utf8Stream::new();
        let euro = "€".as_bytes();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&euro[2..]), "€");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(s.push(&[0xE2, 0x82]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
