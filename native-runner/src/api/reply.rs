//! Building OpenAI-shaped answers from a job's results: whole responses and streamed chunks,
//! for chat and for the legacy completions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use super::tool_calls::{read_call, Call, Piece};
use super::types::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatCompletion, ChatLogprobs,
    Completion, CompletionChoice, CompletionLogprobs, CompletionTokensDetails, Delta, FunctionCall,
    FunctionDelta, PromptTokensDetails, TokenLogprob, ToolCall, ToolCallDelta, TopLogprob, Usage,
};
use webshard::front::FinishReason;

use super::worker::{Finished, TokenChoice};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// What every answer to one request shares.
#[derive(Debug, Clone)]
pub struct Reply {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// The answer may be a tool call (see `tool_calls`).
    pub tool_calls: bool,
}

impl Reply {
    pub fn new(endpoint: Endpoint, model: &str, include_usage: bool, tool_calls: bool) -> Reply {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let serial = NEXT.fetch_add(1, Ordering::SeqCst);
        Reply {
            endpoint,
            id: format!("{prefix}-{:x}{serial:06x}", now.as_micros()),
            created: now.as_secs(),
            model: model.to_string(),
            include_usage,
            tool_calls,
        }
    }

    /// The one call of this answer: its id derives from the response's, so it is unique too.
    fn call_id(&self) -> String {
        format!("call_{}", self.id.trim_start_matches("chatcmpl-"))
    }

    fn tool_call(&self, call: &Call) -> ToolCall {
        ToolCall {
            id: self.call_id(),
            kind: "function".to_string(),
            function: FunctionCall {
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            },
        }
    }

    /// OpenAI's `finish_reason`: `tool_calls` when the answer is a call.
    pub fn finish_reason(&self, done: &Finished, called: bool) -> &'static str {
        match called {
            true => "tool_calls",
            false => finish_str(done.finish),
        }
    }

    /// The non-streamed response.
    pub fn whole(&self, done: &Finished) -> Value {
        let call = self.tool_calls.then(|| read_call(&done.text)).flatten();
        let (content, tool_calls) = match &call {
            Some(call) => (None, Some(vec![self.tool_call(call)])),
            None => (Some(done.text.clone()), None),
        };
        match self.endpoint {
            Endpoint::Chat => json(&ChatCompletion {
                id: self.id.clone(),
                object: "chat.completion",
                created: self.created,
                model: self.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: AssistantMessage {
                        role: "assistant",
                        content,
                        refusal: None,
                        tool_calls,
                    },
                    logprobs: done.logprobs.as_deref().map(chat_logprobs),
                    finish_reason: self.finish_reason(done, call.is_some()),
                }],
                usage: usage(done),
                system_fingerprint: None,
            }),
            Endpoint::Completion => self.completion(
                &done.text,
                done.logprobs.as_deref().map(completion_logprobs),
                Some(finish_str(done.finish)),
                Some(Some(usage(done))),
            ),
        }
    }

    /// Chat streams open with the assistant's role (and empty content, unless the answer
    /// may be a call); completions have no such chunk.
    pub fn opening(&self) -> Option<Value> {
        let delta = Delta {
            role: Some("assistant"),
            content: (!self.tool_calls).then(String::new),
            tool_calls: None,
        };
        (self.endpoint == Endpoint::Chat).then(|| self.chat_chunk(delta, None, None))
    }

    pub fn text(&self, text: &str) -> Value {
        match self.endpoint {
            Endpoint::Chat => {
                let delta = Delta {
                    content: Some(text.to_string()),
                    ..Delta::default()
                };
                self.chat_chunk(delta, None, None)
            }
            Endpoint::Completion => self.completion(text, None, None, self.usage_slot(None)),
        }
    }

    /// The log-probabilities, sent in one chunk once generation is over (see `worker`).
    pub fn logprobs(&self, choices: &[TokenChoice]) -> Value {
        match self.endpoint {
            Endpoint::Chat => self.chat_chunk(Delta::default(), Some(chat_logprobs(choices)), None),
            Endpoint::Completion => self.completion(
                "",
                Some(completion_logprobs(choices)),
                None,
                self.usage_slot(None),
            ),
        }
    }

    /// A chat chunk for a piece of a possible tool call (see `tool_calls::CallReader`).
    pub fn piece(&self, piece: &Piece) -> Value {
        let call = |id, kind, name, arguments| ToolCallDelta {
            index: 0,
            id,
            kind,
            function: FunctionDelta { name, arguments },
        };
        let delta = match piece {
            Piece::Content(text) => return self.text(text),
            Piece::CallStart { name } => call(
                Some(self.call_id()),
                Some("function"),
                Some(name.clone()),
                String::new(),
            ),
            Piece::Arguments(text) => call(None, None, None, text.clone()),
        };
        let delta = Delta {
            tool_calls: Some(vec![delta]),
            ..Delta::default()
        };
        self.chat_chunk(delta, None, None)
    }

    pub fn finish(&self, reason: &'static str) -> Value {
        match self.endpoint {
            Endpoint::Chat => self.chat_chunk(Delta::default(), None, Some(reason)),
            Endpoint::Completion => self.completion("", None, Some(reason), self.usage_slot(None)),
        }
    }

    /// `stream_options.include_usage`'s last chunk: no choices, the usage.
    pub fn usage(&self, done: &Finished) -> Value {
        match self.endpoint {
            Endpoint::Chat => json(&ChatChunk {
                choices: Vec::new(),
                usage: Some(Some(usage(done))),
                ..self.chat_base()
            }),
            Endpoint::Completion => {
                let mut chunk = self.completion("", None, None, Some(Some(usage(done))));
                chunk["choices"] = Value::Array(Vec::new());
                chunk
            }
        }
    }

    fn usage_slot(&self, usage: Option<Usage>) -> Option<Option<Usage>> {
        self.include_usage.then_some(usage)
    }

    fn chat_base(&self) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: Vec::new(),
            usage: self.usage_slot(None),
            system_fingerprint: None,
        }
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Value {
        json(&ChatChunk {
            choices: vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason: finish,
            }],
            ..self.chat_base()
        })
    }

    fn completion(
        &self,
        text: &str,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
        usage: Option<Option<Usage>>,
    ) -> Value {
        json(&Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![CompletionChoice {
                index: 0,
                text: text.to_string(),
                logprobs,
                finish_reason: finish,
            }],
            usage,
            system_fingerprint: None,
        })
    }
}

fn json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).expect("response types serialize")
}

/// OpenAI's `finish_reason`. A cancelled job's client is gone: nobody reads it.
fn finish_str(finish: FinishReason) -> &'static str {
    match finish {
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(done: &Finished) -> Usage {
    let counts = done.usage;
    Usage {
        prompt_tokens: counts.prompt_tokens,
        completion_tokens: counts.completion_tokens,
        total_tokens: counts.prompt_tokens + counts.completion_tokens,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: counts.cached_tokens,
        },
        completion_tokens_details: (done.drafted > 0).then(|| CompletionTokensDetails {
            accepted_prediction_tokens: done.accepted,
            rejected_prediction_tokens: done.drafted - done.accepted,
        }),
    }
}

fn piece(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn chat_logprobs(choices: &[TokenChoice]) -> ChatLogprobs {
    let content = choices
        .iter()
        .map(|choice| TokenLogprob {
            token: piece(&choice.bytes),
            logprob: choice.logprob,
            bytes: choice.bytes.clone(),
            top_logprobs: choice
                .top
                .iter()
                .map(|(bytes, logprob)| TopLogprob {
                    token: piece(bytes),
                    logprob: *logprob,
                    bytes: bytes.clone(),
                })
                .collect(),
        })
        .collect();
    ChatLogprobs {
        content,
        refusal: None,
    }
}

fn completion_logprobs(choices: &[TokenChoice]) -> CompletionLogprobs {
    let tokens: Vec<String> = choices.iter().map(|c| piece(&c.bytes)).collect();
    let mut offset = 0;
    let text_offset = tokens
        .iter()
        .map(|token| {
            let at = offset;
            offset += token.len();
            at
        })
        .collect();
    CompletionLogprobs {
        token_logprobs: choices.iter().map(|c| c.logprob).collect(),
        top_logprobs: choices
            .iter()
            .map(|c| {
                c.top
                    .iter()
                    .map(|(bytes, logprob)| (piece(bytes), *logprob))
                    .collect::<HashMap<_, _>>()
            })
            .collect(),
        text_offset,
        tokens,
    }
}
