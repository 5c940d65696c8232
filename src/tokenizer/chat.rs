//! Chat prompts: the model's Jinja template (`tokenizer.chat_template`) rendered with minijinja,
//! configured like Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks,
//! `raise_exception`, Python string methods). Files without a template get llama.cpp's built-in
//! format for their architecture: Gemma's turn format for `gemma*`, ChatML otherwise.
//!
//! Tools (OpenAI's `tools`) go into the context as `tools`, the way Hugging Face passes them;
//! whether a template uses them is found by rendering a probe tool once (llama.cpp's minja
//! does the same), and how it writes a call (Hermes' `<tool_call>` tags, as Qwen2.5 does) by
//! rendering a probe call.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{Tokenizer, TokenizerError};

/// Instruction budget for one render, so a hostile template cannot run unbounded.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls, in OpenAI's shape (`[{id, type, function: {name,
    /// arguments}}]`) with `arguments` as a JSON value, which is what templates print.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// A `tool` turn: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// How a template lets a model call tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSupport {
    /// The template never shows the model its tools.
    None,
    /// Calls are `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes,
    /// Qwen2.5).
    Hermes,
    /// The template shows tools but writes calls in a format this crate does not parse.
    Other,
}

/// The probe tool's name: nothing a real conversation contains.
const PROBE_TOOL: &str = "webshard_probe_tool_7f3a";

enum Format {
    Jinja(Box<Environment<'static>>),
    /// llama.cpp's `LLM_CHAT_TEMPLATE_GEMMA`.
    Gemma,
    /// llama.cpp's fallback when a file has no template.
    ChatMl,
}

/// A model's chat format, ready to render.
pub struct ChatTemplate {
    format: Format,
    bos_token: String,
    eos_token: String,
    /// Whether the tokenizer adds BOS itself, so a rendered leading BOS must be dropped.
    tokenizer_adds_bos: bool,
    tools: ToolSupport,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let format = match self.format {
            Format::Jinja(_) => "jinja",
            Format::Gemma => "builtin gemma",
            Format::ChatMl => "builtin chatml",
        };
        f.debug_struct("ChatTemplate")
            .field("format", &format)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn jinja_environment(source: &str) -> Result<Environment<'static>, TokenizerError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| TokenizerError::Template(e.to_string()))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_template_owned("chat", source.to_owned())
        .map_err(|e| TokenizerError::Template(e.to_string()))?;
    Ok(env)
}

/// C's `isspace` set, which llama.cpp's `trim` uses (Rust's ASCII whitespace lacks `\v`).
fn trim_c(text: &str) -> &str {
    text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

impl ChatTemplate {
    /// The chat format of the model this tokenizer belongs to.
    pub fn new(tokenizer: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let text_of = |id: Option<u32>| {
            id.and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
                .to_owned()
        };
        let format = match (tokenizer.chat_template_source(), tokenizer.architecture()) {
            (Some(source), _) => Format::Jinja(Box::new(jinja_environment(source)?)),
            (None, Some(arch)) if arch.starts_with("gemma") => Format::Gemma,
            (None, _) => Format::ChatMl,
        };
        let mut template = ChatTemplate {
            format,
            bos_token: text_of(tokenizer.bos_id()),
            eos_token: text_of(tokenizer.eos_id()),
            tokenizer_adds_bos: tokenizer.adds_bos(),
            tools: ToolSupport::None,
        };
        template.tools = template.probe_tools();
        Ok(template)
    }

    /// Whether (and how) this template shows tools and their calls to the model.
    pub fn tool_support(&self) -> ToolSupport {
        self.tools
    }

    /// Renders a probe tool, then a probe call: a template that prints neither has no tools.
    fn probe_tools(&self) -> ToolSupport {
        let tool = json!({"type": "function", "function": {
            "name": PROBE_TOOL, "description": "probe", "parameters": {"type": "object"}}});
        let ask = [ChatMessage::new("user", "probe")];
        let shown = self
            .render_with_tools(&ask, std::slice::from_ref(&tool), true)
            .is_ok_and(|text| text.contains(PROBE_TOOL));
        if !shown {
            return ToolSupport::None;
        }
        let call = ChatMessage {
            tool_calls: Some(json!([{"id": "call_0", "type": "function",
                "function": {"name": PROBE_TOOL, "arguments": {}}}])),
            ..ChatMessage::new("assistant", "")
        };
        let conversation = [ask[0].clone(), call];
        match self.render_with_tools(&conversation, &[tool], false) {
            Ok(text) if text.contains(&format!("<tool_call>\n{{\"name\": \"{PROBE_TOOL}\"")) => {
                ToolSupport::Hermes
            }
            _ => ToolSupport::Other,
        }
    }

    /// The built-in format used for a model that has no chat template of its own, named for
    /// the user; None when the model's own template renders the conversation.
    pub fn builtin_format(&self) -> Option<&'static str> {
        match self.format {
            Format::Jinja(_) => None,
            Format::Gemma => {
                Some("the built-in Gemma turn format (<start_of_turn>role … <end_of_turn>)")
            }
            Format::ChatMl => Some("the built-in ChatML format (<|im_start|>role … <|im_end|>)"),
        }
    }

    /// The full rendering, as the template produces it (it may start with the BOS text).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// `render` with tool definitions (OpenAI's `tools` entries) in the context; the built-in
    /// formats have no place for them and ignore them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        // Templates test `if tools`: an absent list, not an empty one, is "no tools".
        let tools = (!tools.is_empty()).then_some(tools);
        match &self.format {
            Format::Jinja(env) => {
                let template = env
                    .get_template("chat")
                    .map_err(|e| TokenizerError::Template(e.to_string()))?;
                template
                    .render(context! {
                        messages => minijinja::value::Serde(messages),
                        tools => tools.map(minijinja::value::Serde),
                        add_generation_prompt => add_generation_prompt,
                        bos_token => &self.bos_token,
                        eos_token => &self.eos_token,
                    })
                    .map_err(|e| TokenizerError::Template(format!("{e:#}")))
            }
            Format::Gemma => Ok(self.render_gemma(messages, add_generation_prompt)),
            Format::ChatMl => Ok(render_chatml(messages, add_generation_prompt)),
        }
    }

    /// The text to tokenize with `encode(text, add_special = true, parse_special = true)`:
    /// the rendering without a leading BOS text when the tokenizer adds BOS itself.
    pub fn render_prompt(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_prompt_with_tools(messages, &[], add_generation_prompt)
    }

    /// `render_prompt` with tool definitions (see `render_with_tools`).
    pub fn render_prompt_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let rendered = self.render_with_tools(messages, tools, add_generation_prompt)?;
        if self.tokenizer_adds_bos && !self.bos_token.is_empty() {
            if let Some(rest) = rendered.strip_prefix(self.bos_token.as_str()) {
                return Ok(rest.to_owned());
            }
        }
        Ok(rendered)
    }

    /// Gemma's turns; "assistant" is "model", system text joins the next non-model turn.
    /// The leading BOS matches Gemma's own template, which starts with `bos_token`.
    fn render_gemma(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut out = self.bos_token.clone();
        let mut system = String::new();
        for message in messages {
            if message.role == "system" {
                system.push_str(trim_c(&message.content));
                continue;
            }
            let role = if message.role == "assistant" {
                "model"
            } else {
                message.role.as_str()
            };
            out.push_str("<start_of_turn>");
            out.push_str(role);
            out.push('\n');
            if !system.is_empty() && role != "model" {
                out.push_str(&system);
                out.push_str("\n\n");
                system.clear();
            }
            out.push_str(trim_c(&message.content));
            out.push_str("<end_of_turn>\n");
        }
        if add_generation_prompt {
            out.push_str("<start_of_turn>model\n");
        }
        out
    }
}

fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for message in messages {
        out.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            message.role, message.content
        ));
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}
