//! Constrained decoding: a JSON value, a JSON Schema, a regular expression or a Lark grammar
//! decides which tokens may come next. llguidance compiles the constraint and computes the
//! allowed set; this module is the seam between it and our sampler.
//!
//! Per step: [`Constraint::allowed`] gives the [`TokenMask`], [`TokenMask::apply`] sends the
//! disallowed logits to −∞ (so greedy is the argmax over the allowed tokens and a draw never
//! picks a disallowed one), and [`Constraint::commit`] consumes the chosen token.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use toktrie::SimpleVob;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;

use super::token_view::TokenView;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConstraintError {
    #[error("invalid constraint: {0}")]
    Compile(String),
    #[error("the constraint rejected token {id}: {why}")]
    Rejected { id: u32, why: String },
    #[error("the constraint allows no token here: {0}")]
    Dead(String),
    #[error("the vocabulary has no end-of-generation token, which a constraint needs to end")]
    NoEndOfGeneration,
}

/// What the output must be. Serialized with a `type` tag so the HTTP API and the page can
/// pass it through: OpenAI's `response_format: {"type": "json_object"}` maps to
/// [`ConstraintSpec::json_object`], `{"type": "json_schema", "json_schema": {"schema": S}}`
/// to `JsonSchema { schema: S }`, and a forced tool call to [`ConstraintSpec::tool_call`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ConstraintSpec {
    /// Any JSON value.
    Json,
    /// A JSON value valid under this JSON Schema (objects, arrays, enums, `required`,
    /// `$defs` with `#/...` references, number bounds, string patterns and lengths).
    JsonSchema { schema: Value },
    /// Text matching this regular expression in full (Rust `regex` syntax).
    Regex { pattern: String },
    /// Text in the language of this Lark grammar (llguidance's Lark dialect: `start` rule,
    /// `/regex/` terminals, `%json {schema}` for embedded JSON).
    Lark { grammar: String },
}

impl ConstraintSpec {
    /// OpenAI's `json_object` mode: a JSON object.
    pub fn json_object() -> ConstraintSpec {
        ConstraintSpec::JsonSchema {
            schema: json!({"type": "object"}),
        }
    }

    /// A call of one of `functions` (name, JSON Schema of the parameters) as the JSON
    /// `{"name": ..., "arguments": {...}}` that tool-calling chat templates expect.
    pub fn tool_call<'a>(functions: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Self {
        ConstraintSpec::JsonSchema {
            schema: tool_call_schema(functions),
        }
    }

    /// A call in Hermes' tags, as Qwen2.5's template writes them:
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, the JSON as in
    /// [`ConstraintSpec::tool_call`] with the template's separators (`", "`, `": "`). With
    /// `or_text`, free text may come instead of the call (OpenAI's `tool_choice: auto`) as
    /// long as it does not start with `<` (so text and a call never share a prefix) or `{`
    /// (small models otherwise write the call's JSON bare, without its tags).
    pub fn hermes_tool_call<'a>(
        functions: impl IntoIterator<Item = (&'a str, &'a Value)>,
        or_text: bool,
    ) -> Self {
        let mut schema = tool_call_schema(functions);
        schema["x-guidance"] = json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        });
        let start = match or_text {
            true => "start: tool_call | TEXT\nTEXT: /[^<{](?s:.)*/\n",
            false => "start: tool_call\n",
        };
        let grammar = format!(
            "{start}tool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"
        );
        ConstraintSpec::Lark { grammar }
    }

    /// Compiles the constraint over single bytes: a bad schema, regex or grammar fails here,
    /// before any model is loaded.
    pub fn check(&self) -> Result<(), ConstraintError> {
        Constraint::new(&TokenView::bytes_only()?, self).map(|_| ())
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            ConstraintSpec::Json => TopLevelGrammar::from_json_schema(compact(json!({}))),
            ConstraintSpec::JsonSchema { schema } => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            ConstraintSpec::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
            ConstraintSpec::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
        }
    }
}

/// `{"name": N, "arguments": A}` for one of the functions: an `anyOf` over them, each with its
/// name as a constant and its parameters' schema for the arguments.
fn tool_call_schema<'a>(functions: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Value {
    let calls: Vec<Value> = functions
        .into_iter()
        .map(|(name, parameters)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    json!({"anyOf": calls})
}

/// JSON without optional whitespace unless the schema asks otherwise (`x-guidance`): small
/// models otherwise spend their token budget on indentation and newlines.
fn compact(schema: Value) -> Value {
    match schema {
        Value::Object(mut map) => {
            map.entry("x-guidance")
                .or_insert_with(|| json!({"whitespace_flexible": false}));
            Value::Object(map)
        }
        // `true` is the schema that allows anything.
        Value::Bool(true) => compact(json!({})),
        other => other,
    }
}

/// One generation's constraint state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab_size: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("complete", &self.is_complete())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    pub fn new(view: &TokenView, spec: &ConstraintSpec) -> Result<Constraint, ConstraintError> {
        let parser = view
            .factory()
            .create_parser(spec.grammar())
            .map_err(|e| ConstraintError::Compile(first_line(&e.to_string())))?;
        Ok(Constraint {
            matcher: Matcher::new(Ok(parser)),
            vocab_size: view.vocab_size(),
        })
    }

    /// The tokens allowed next (end-of-generation ones once the output may end; only those
    /// once it must).
    pub fn allowed(&mut self) -> Result<TokenMask, ConstraintError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Dead(first_line(&e.to_string())))?;
        if allowed.num_set() == 0 {
            return Err(ConstraintError::Dead("empty token set".into()));
        }
        Ok(TokenMask { allowed })
    }

    /// Consumes the chosen token; a token the last mask did not allow is an error.
    pub fn commit(&mut self, id: u32) -> Result<(), ConstraintError> {
        if id as usize >= self.vocab_size {
            return Err(ConstraintError::Rejected {
                id,
                why: "outside the vocabulary".into(),
            });
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| ConstraintError::Rejected {
                id,
                why: first_line(&e.to_string()),
            })
    }

    /// Whether the output is finished: nothing more may follow it.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output may end here (end-of-generation is allowed).
    pub fn can_end(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// llguidance's errors say what broke in their first lines (a regex error's detail is on the
/// next ones) and dump the parser state after: keep the first few lines, bounded.
fn first_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .take(4)
        .collect();
    lines.join(" ").chars().take(400).collect()
}

/// The set of tokens allowed at one step.
#[derive(Clone, Debug)]
pub struct TokenMask {
    allowed: SimpleVob,
}

impl TokenMask {
    /// The set of the ids in `runs` among `len` ids (a mask received from elsewhere: the
    /// fleet's coordinator sends it to the last stage).
    pub fn from_runs(len: usize, runs: impl IntoIterator<Item = Range<u32>>) -> TokenMask {
        let mut allowed = SimpleVob::alloc(len);
        for run in runs {
            let end = run.end.min(len as u32);
            if run.start < end {
                allowed.allow_range(run.start..=end - 1);
            }
        }
        TokenMask { allowed }
    }

    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.allowed.len() && self.allowed.is_allowed(id)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.allowed.num_set()
    }

    /// The allowed ids, ascending.
    pub fn ids(&self) -> Vec<u32> {
        self.allowed.to_list()
    }

    /// The set as `n.div_ceil(32)` words, bit `id % 32` of word `id / 32` set for an allowed
    /// id below `n` (the GPU mask's layout, `ops::select::mask`); ids past the vocabulary
    /// (padded heads) are never allowed.
    pub fn words(&self, n: usize) -> Vec<u32> {
        let known = n.min(self.allowed.len());
        let mut words: Vec<u32> = (0..n.div_ceil(32))
            .map(|w| self.allowed.as_slice().get(w).copied().unwrap_or(0))
            .collect();
        if let Some(last) = words.get_mut(known / 32) {
            *last &= (1u32 << (known % 32)).wrapping_sub(1);
        }
        for word in words.iter_mut().skip(known / 32 + 1) {
            *word = 0;
        }
        words
    }

    /// Sends every disallowed logit to −∞, including those past the vocabulary (padded heads).
    pub fn apply(&self, logits: &mut [f32]) {
        // 32 ids per word: whole words of allowed or disallowed ids are skipped or filled.
        for (chunk, &bits) in logits.chunks_mut(32).zip(self.allowed.as_slice()) {
            match bits {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => {
                    for (bit, logit) in chunk.iter_mut().enumerate() {
                        if bits & (1 << bit) == 0 {
                            *logit = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        if let Some(past) = logits.get_mut(self.allowed.len()..) {
            past.fill(f32::NEG_INFINITY);
        }
    }
}
