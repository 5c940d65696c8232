//! A generated answer read back as a tool call, whole or while it streams.
//!
//! Under a tool constraint (`structured::tool_plan`) the output is either free text that does
//! not start with `<` (nor `{`), or exactly `<tool_call>\n{"name": "N", "arguments": {...}}\n</tool_call>`
//! (the separators are the grammar's, names are plain identifiers). So the first character
//! decides which it is, the name is known once its header is complete, and the arguments
//! are the JSON object after it, up to its matching brace: streamed as they come, and the
//! same bytes when read whole.

/// How a call opens, up to the name.
const CALL_OPENING: &str = "<tool_call>\n{\"name\": \"";
/// Between the name and the arguments.
const NAME_TO_ARGUMENTS: &str = "\", \"arguments\": ";

/// What a piece of streamed text turns out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    /// The call's function is known: its first delta.
    CallStart {
        name: String,
    },
    /// More of the arguments' JSON text.
    Arguments(String),
}

/// A finished call: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Nothing generated yet.
    Undecided,
    Content,
    /// A call whose header is not complete yet.
    Header,
    /// In the arguments, which start at `start` of the text.
    Arguments {
        start: usize,
        scanner: JsonScanner,
    },
    /// The arguments' closing brace was seen; the rest is the closing tag.
    Closed,
}

/// Reads a stream of text pieces into content or a call.
#[derive(Debug, Clone)]
pub struct CallReader {
    text: String,
    state: State,
    name: String,
    /// Bytes of the text already handed out as arguments.
    sent: usize,
}

impl Default for CallReader {
    fn default() -> CallReader {
        CallReader {
            text: String::new(),
            state: State::Undecided,
            name: String::new(),
            sent: 0,
        }
    }
}

impl CallReader {
    /// Takes the next piece of text and says what it adds.
    pub fn push(&mut self, piece: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        if let State::Content = self.state {
            out.push(Piece::Content(piece.to_string()));
            return out;
        }
        self.text.push_str(piece);
        if self.state == State::Undecided {
            match self.text.chars().next() {
                None => return out,
                Some('<') => self.state = State::Header,
                Some(_) => {
                    self.state = State::Content;
                    out.push(Piece::Content(std::mem::take(&mut self.text)));
                    return out;
                }
            }
        }
        if self.state == State::Header {
            match self.header() {
                Some((name, start)) => {
                    self.name = name.clone();
                    out.push(Piece::CallStart { name });
                    self.sent = start;
                    self.state = State::Arguments {
                        start,
                        scanner: JsonScanner::default(),
                    };
                }
                None => return out,
            }
        }
        if let State::Arguments { scanner, .. } = &mut self.state {
            let fresh = &self.text[self.sent..];
            let (taken, closed) = scanner.feed(fresh);
            if taken > 0 {
                out.push(Piece::Arguments(fresh[..taken].to_string()));
                self.sent += taken;
            }
            if closed {
                self.state = State::Closed;
            }
        }
        out
    }

    /// The name and where the arguments start, once the header is all there.
    fn header(&self) -> Option<(String, usize)> {
        let rest = self.text.strip_prefix(CALL_OPENING)?;
        let name_len = rest.find('"')?;
        let after = &rest[name_len..];
        if !after.starts_with(NAME_TO_ARGUMENTS) {
            return None;
        }
        let start = CALL_OPENING.len() + name_len + NAME_TO_ARGUMENTS.len();
        (self.text.len() >= start).then(|| (rest[..name_len].to_string(), start))
    }

    /// The call, when the text was one and its arguments closed and parse as JSON.
    pub fn call(&self) -> Option<Call> {
        let State::Closed = self.state else {
            return None;
        };
        let start = CALL_OPENING.len() + self.name.len() + NAME_TO_ARGUMENTS.len();
        let arguments = self.text.get(start..self.sent)?.to_string();
        serde_json::from_str::<serde_json::Value>(&arguments).ok()?;
        Some(Call {
            name: self.name.clone(),
            arguments,
        })
    }
}

/// The call in a whole answer, if it is one.
pub fn read_call(text: &str) -> Option<Call> {
    let mut reader = CallReader::default();
    reader.push(text);
    reader.call()
}

/// Where a JSON value's text ends: brace and bracket depth outside strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct JsonScanner {
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl JsonScanner {
    /// How many bytes of `text` belong to the value, and whether it closed within them.
    fn feed(&mut self, text: &str) -> (usize, bool) {
        for (at, byte) in text.bytes().enumerate() {
            if self.in_string {
                match (self.escaped, byte) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return (at + 1, true);
                    }
                }
                _ => {}
            }
        }
        (text.len(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\\\"\", \"days\": [1, {\"a\": 2}]}}\n</tool_call>";

    #[test]
    fn a_whole_call_reads_back_with_its_exact_arguments() {
        let call = read_call(CALL).expect("a call");
        assert_eq!(call.name, "get_weather");
        assert_eq!(
            call.arguments,
            "{\"city\": \"Pa}ris\\\"\", \"days\": [1, {\"a\": 2}]}"
        );
        assert_eq!(read_call("Sunny, 18 degrees."), None);
        // Cut short (max_tokens): no call.
        assert_eq!(read_call(&CALL[..40]), None);
    }

    #[test]
    fn streamed_pieces_of_any_size_reassemble_to_the_same_call() {
        let whole = read_call(CALL).expect("a call");
        for size in [1, 2, 3, 7, 500] {
            let mut reader = CallReader::default();
            let mut pieces = Vec::new();
            let chars: Vec<char> = CALL.chars().collect();
            for chunk in chars.chunks(size) {
                pieces.extend(reader.push(&chunk.iter().collect::<String>()));
            }
            let Some(Piece::CallStart { name }) = pieces.first() else {
                panic!("size {size}: {pieces:?}")
            };
            assert_eq!(name, &whole.name);
            let arguments: String = pieces[1..]
                .iter()
                .map(|p| match p {
                    Piece::Arguments(text) => text.as_str(),
                    other => panic!("size {size}: {other:?}"),
                })
                .collect();
            assert_eq!(arguments, whole.arguments, "size {size}");
            assert_eq!(reader.call(), Some(whole.clone()));
        }
    }

    #[test]
    fn text_streams_as_content() {
        let mut reader = CallReader::default();
        assert_eq!(reader.push(""), vec![]);
        assert_eq!(reader.push("Hi"), vec![Piece::Content("Hi".into())]);
        assert_eq!(reader.push(" <b>"), vec![Piece::Content(" <b>".into())]);
        assert_eq!(reader.call(), None);
    }
}
