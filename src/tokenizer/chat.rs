//! Chat prompts: the model's Jinja template (`tokenizer.chat_template`) rendered with minijinja,
//! configured like Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks,
//! `raise_exception`, Python string methods). Files without a template get llama.cpp's built-in
//! format for their architecture: Gemma's turn format for `gemma*`, ChatML otherwise.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use super::{Tokenizer, TokenizerError};

/// Instruction budget for one render, so a hostile template cannot run unbounded.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

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
        Ok(ChatTemplate {
            format,
            bos_token: text_of(tokenizer.bos_id()),
            eos_token: text_of(tokenizer.eos_id()),
            tokenizer_adds_bos: tokenizer.adds_bos(),
        })
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
        match &self.format {
            Format::Jinja(env) => {
                let template = env
                    .get_template("chat")
                    .map_err(|e| TokenizerError::Template(e.to_string()))?;
                template
                    .render(context! {
                        messages => minijinja::value::Serde(messages),
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
        let rendered = self.render(messages, add_generation_prompt)?;
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
