//! From a parsed request to a job: every field checked and named when it cannot be honoured,
//! mapped onto the front door's `GenerateRequest` (chat messages as `Prompt::Chat`, a
//! completion's prompt as `Prompt::Text` or `Prompt::Ids`), the prompt rendered and tokenized
//! as the generator will, and its length checked against the context before any work is
//! queued.

use serde_json::{json, Value};
use webshard::front::{GenerateOptions, GenerateRequest, Prompt as ModelPrompt, RequestError};
use webshard::sample::lookup::SpecRequestError;
use webshard::sample::{ConstraintSpec, SamplerConfig, SpecConfig};
use webshard::tokenizer::ChatMessage;

use super::errors::ApiError;
use super::structured::{response_constraint, tool_plan};
use super::types::{
    ChatRequest, CompletionRequest, Content, Message, Prompt, Role, Sampling, SpecRequest,
};
use super::worker::PromptFront;

/// OpenAI's limits on `stop` and `top_logprobs`, and the legacy `logprobs`.
const MAX_STOPS: usize = 4;
const MAX_TOP_LOGPROBS: u32 = 20;
const MAX_LEGACY_LOGPROBS: u32 = 5;
/// The legacy completions endpoint's default `max_tokens`.
const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;

/// What a request asks for, checked.
#[derive(Debug, Clone)]
pub struct Plan {
    pub request: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// The answer may be a tool call, to be read back from the text.
    pub tool_calls: bool,
}

pub fn chat_plan(req: &ChatRequest, front: &PromptFront) -> Result<Plan, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "`messages` must not be empty",
        ));
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| chat_message(message, index))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let (sampler, stop) = sampling(&req.sampling())?;
    let tools = tool_plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        front.tool_support(),
        &req.model,
    )?;
    let format = response_constraint(req.response_format.as_ref())?;
    if tools.is_some() && format.is_some() {
        return Err(ApiError::bad_field(
            "response_format",
            "`response_format` and a possible tool call cannot be combined; send `tool_choice: \"none\"` or no `response_format`",
        ));
    }
    let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
    let max_tokens = match (req.max_completion_tokens, req.max_tokens) {
        (Some(n), _) => Some(positive("max_completion_tokens", n)?),
        (None, Some(n)) => Some(positive("max_tokens", n)?),
        (None, None) => None,
    };
    let tool_calls = tools.is_some();
    let (prompt, constraint) = match tools {
        Some(plan) => (
            ModelPrompt::ToolChat {
                messages,
                tools: plan.tools,
            },
            Some(plan.constraint),
        ),
        None => (ModelPrompt::Chat(messages), format),
    };
    let prompt_ids = front
        .prompt_ids(&prompt)
        .map_err(|err| prompt_error("messages", err))?;
    let max_tokens = fit_context(prompt_ids.len(), max_tokens, front.max_context, "messages")?;
    let mut request = generate_request(prompt, max_tokens, sampler, stop, constraint, logprobs);
    request.options.speculation = speculation(req.webshard_spec.as_ref())?;
    Ok(Plan {
        request,
        stream: req.stream.unwrap_or(false),
        include_usage: include_usage(req.stream, req.stream_options.as_ref())?,
        tool_calls,
    })
}

/// One message as the template takes it: text content, an assistant's calls with their
/// arguments parsed (templates print them as JSON), a tool result's call id.
fn chat_message(message: &Message, index: usize) -> Result<ChatMessage, ApiError> {
    let content = content_text(message.content.as_ref(), index)?;
    let mut out = ChatMessage::new(message.role.template_name(), content);
    if let Some(calls) = &message.tool_calls {
        if message.role != Role::Assistant {
            return Err(ApiError::bad_field(
                &format!("messages[{index}].tool_calls"),
                "only assistant messages carry `tool_calls`",
            ));
        }
        let calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let arguments = serde_json::from_str(&call.function.arguments)
                    .unwrap_or_else(|_| Value::String(call.function.arguments.clone()));
                json!({"id": call.id, "type": call.kind,
                    "function": {"name": call.function.name, "arguments": arguments}})
            })
            .collect();
        out.tool_calls = Some(Value::Array(calls));
    }
    match (message.role, &message.tool_call_id) {
        (Role::Tool, None) => Err(ApiError::bad_field(
            &format!("messages[{index}].tool_call_id"),
            "a `tool` message needs the `tool_call_id` of the call it answers",
        )),
        (Role::Tool, Some(id)) => {
            out.tool_call_id = Some(id.clone());
            Ok(out)
        }
        (_, Some(_)) => Err(ApiError::bad_field(
            &format!("messages[{index}].tool_call_id"),
            "only `tool` messages carry `tool_call_id`",
        )),
        (_, None) => Ok(out),
    }
}

pub fn completion_plan(req: &CompletionRequest, front: &PromptFront) -> Result<Plan, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::bad_field("echo", "`echo` is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_field("suffix", "`suffix` is not supported"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_field(
            "best_of",
            "only `best_of: 1` is supported",
        ));
    }
    let (sampler, stop) = sampling(&req.sampling())?;
    let constraint = response_constraint(req.response_format.as_ref())?;
    let logprobs = match req.logprobs {
        Some(n) if n > MAX_LEGACY_LOGPROBS => {
            return Err(ApiError::bad_field(
                "logprobs",
                format!("`logprobs` must be at most {MAX_LEGACY_LOGPROBS}"),
            ))
        }
        other => other,
    };
    let max_tokens = positive(
        "max_tokens",
        req.max_tokens.unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS),
    )?;
    let prompt = completion_prompt(&req.prompt)?;
    let prompt_ids = front
        .prompt_ids(&prompt)
        .map_err(|err| prompt_error("prompt", err))?;
    let max_tokens = fit_context(
        prompt_ids.len(),
        Some(max_tokens),
        front.max_context,
        "prompt",
    )?;
    let mut request = generate_request(prompt, max_tokens, sampler, stop, constraint, logprobs);
    request.options.speculation = speculation(req.webshard_spec.as_ref())?;
    Ok(Plan {
        request,
        stream: req.stream.unwrap_or(false),
        include_usage: include_usage(req.stream, req.stream_options.as_ref())?,
        tool_calls: false,
    })
}

fn content_text(content: Option<&Content>, index: usize) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text.clone()),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (part_index, part) in parts.iter().enumerate() {
                if part.kind != "text" {
                    return Err(ApiError::bad_field(
                        &format!("messages[{index}].content[{part_index}].type"),
                        format!(
                            "content parts of type `{}` are not supported (text only)",
                            part.kind
                        ),
                    ));
                }
                text.push_str(&part.text);
            }
            Ok(text)
        }
    }
}

/// The completion's prompt as the front door takes it: text, or ids taken as they are.
fn completion_prompt(prompt: &Prompt) -> Result<ModelPrompt, ApiError> {
    Ok(match prompt {
        Prompt::Text(text) => ModelPrompt::Text(text.clone()),
        Prompt::Ids(ids) => ModelPrompt::Ids(ids.clone()),
        Prompt::Texts(texts) => ModelPrompt::Text(single(texts)?.clone()),
        Prompt::IdLists(lists) => ModelPrompt::Ids(single(lists)?.clone()),
    })
}

/// A prompt the generator refuses (empty, an id outside the vocabulary, a template that
/// fails to render): a 400 naming `param`.
fn prompt_error(param: &str, err: RequestError) -> ApiError {
    ApiError::bad_field(param, err.to_string())
}

fn generate_request(
    prompt: ModelPrompt,
    max_tokens: u32,
    sampler: SamplerConfig,
    stop: Vec<String>,
    constraint: Option<ConstraintSpec>,
    logprobs: Option<u32>,
) -> GenerateRequest {
    let options = GenerateOptions {
        max_tokens,
        sampler,
        stop,
        constraint,
        logprobs,
        speculation: None,
    };
    GenerateRequest::new(prompt, options)
}

/// `webshard_spec` as the front door's speculation; `None` when absent (the server's
/// `--spec` then decides).
fn speculation(spec: Option<&SpecRequest>) -> Result<Option<SpecConfig>, ApiError> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    SpecConfig::named(&spec.kind, spec.draft_max)
        .map(Some)
        .map_err(|err| match err {
            SpecRequestError::Kind(why) => {
                ApiError::bad_field("webshard_spec.type", format!("`webshard_spec.type` {why}"))
            }
            SpecRequestError::DraftMax(why) => ApiError::bad_field("webshard_spec.draft_max", why),
        })
}

/// One prompt per request: several would be several choices, like `n` > 1.
fn single<T>(items: &[T]) -> Result<&T, ApiError> {
    match items {
        [one] => Ok(one),
        _ => Err(ApiError::bad_field(
            "prompt",
            format!(
                "exactly one prompt per request is supported, got {}",
                items.len()
            ),
        )),
    }
}

/// The sampler and stop strings; OpenAI's defaults (temperature 1, top_p 1) and neutral
/// llama-server extensions when a field is absent.
fn sampling(s: &Sampling) -> Result<(SamplerConfig, Vec<String>), ApiError> {
    if s.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_field(
            "n",
            "only `n: 1` is supported (one choice per request)",
        ));
    }
    in_range("frequency_penalty", s.frequency_penalty, -2.0, 2.0)?;
    in_range("presence_penalty", s.presence_penalty, -2.0, 2.0)?;
    if s.logit_bias.as_ref().is_some_and(|bias| !bias.is_empty()) {
        return Err(ApiError::bad_field(
            "logit_bias",
            "`logit_bias` is not supported",
        ));
    }
    in_range("temperature", s.temperature, 0.0, 2.0)?;
    in_range("top_p", s.top_p, 0.0, 1.0)?;
    in_range("min_p", s.min_p, 0.0, 1.0)?;
    in_range("repeat_penalty", s.repeat_penalty, 0.0, 10.0)?;
    if s.repeat_penalty == Some(0.0) {
        return Err(ApiError::bad_field(
            "repeat_penalty",
            "`repeat_penalty` must be above 0",
        ));
    }
    let stop = s
        .stop
        .clone()
        .map(|stop| stop.into_vec())
        .unwrap_or_default();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::bad_field(
            "stop",
            format!("at most {MAX_STOPS} stop sequences"),
        ));
    }
    let config = SamplerConfig {
        temperature: s.temperature.unwrap_or(1.0),
        top_k: s.top_k.unwrap_or(0) as usize,
        top_p: s.top_p.unwrap_or(1.0),
        min_p: s.min_p.unwrap_or(0.0),
        repeat_penalty: s.repeat_penalty.unwrap_or(1.0),
        repeat_last_n: 64,
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        seed: s.seed.map_or_else(fresh_seed, |seed| seed as u64),
    };
    Ok((config, stop))
}

/// Without a seed every request draws differently, as OpenAI's do.
fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn in_range(param: &str, value: Option<f32>, low: f32, high: f32) -> Result<(), ApiError> {
    match value {
        Some(v) if !(low..=high).contains(&v) => Err(ApiError::bad_field(
            param,
            format!("`{param}` must be between {low} and {high}, got {v}"),
        )),
        _ => Ok(()),
    }
}

fn positive(param: &str, value: u32) -> Result<u32, ApiError> {
    if value == 0 {
        return Err(ApiError::bad_field(
            param,
            format!("`{param}` must be at least 1"),
        ));
    }
    Ok(value)
}

fn chat_logprobs(logprobs: Option<bool>, top: Option<u32>) -> Result<Option<u32>, ApiError> {
    match (logprobs.unwrap_or(false), top) {
        (_, Some(n)) if n > MAX_TOP_LOGPROBS => Err(ApiError::bad_field(
            "top_logprobs",
            format!("`top_logprobs` must be at most {MAX_TOP_LOGPROBS}"),
        )),
        (false, Some(_)) => Err(ApiError::bad_field(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (true, top) => Ok(Some(top.unwrap_or(0))),
        (false, None) => Ok(None),
    }
}

fn include_usage(
    stream: Option<bool>,
    options: Option<&super::types::StreamOptions>,
) -> Result<bool, ApiError> {
    match options {
        Some(_) if stream != Some(true) => Err(ApiError::bad_field(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        )),
        Some(options) => Ok(options.include_usage.unwrap_or(false)),
        None => Ok(false),
    }
}

/// The most tokens to generate: what was asked, or the rest of the context; a 400 when the
/// prompt and the completion do not fit.
fn fit_context(
    prompt: usize,
    max_tokens: Option<u32>,
    context: u32,
    param: &str,
) -> Result<u32, ApiError> {
    let wanted = max_tokens.unwrap_or(1) as usize;
    if prompt + wanted > context as usize {
        let mut err = ApiError::context_length(format!(
            "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the {param}, {wanted} in the completion). Please reduce the length of the {param} or completion.",
            prompt + wanted
        ));
        err.param = Some(param.to_string());
        return Err(err);
    }
    Ok(max_tokens.unwrap_or(context - prompt as u32))
}
