//! Options objects passed from JavaScript, parsed with serde (unknown keys are errors, so a
//! typo is reported rather than silently ignored), and plain objects handed back.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::JsValue;

use super::error::WebError;
use crate::front::GenerateOptions;
use crate::model::decode::MAX_DEPTH;
use crate::model::LoadOptions;
use crate::sample::lookup::SpecRequestError;
use crate::sample::{ConstraintSpec, SamplerConfig, SpecConfig};

/// Longest generation one call may ask for.
const MAX_TOKENS: u32 = 1 << 16;
/// Largest chunk one range request may read.
const MAX_CHUNK_BYTES: u64 = 64 << 20;
const MAX_IN_FLIGHT: usize = 16;
/// Greedy decoding's steps in flight in the page: four, not native's two
/// (`model::decode::DEFAULT_DEPTH`). A browser's read-back resolves through the GPU process,
/// later than one step's time, so with two in flight the GPU waited on it: on an H100 the
/// page decoded at 0.60x the native runner with two and 0.89x with four (docs/perf.md,
/// session 35); natively four gave nothing (-1%). Past a stop each costs a wasted step.
const PAGE_DEPTH: usize = 4;

/// The plain-data part of `Engine.load`'s options (callbacks and the signal are read apart).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LoadSettings {
    /// Keep downloaded ranges in OPFS and reuse them.
    pub cache: bool,
    pub max_context: u32,
    pub chunk_bytes: u64,
    pub in_flight: usize,
    /// Use the f32 kernels even where the adapter has shader-f16.
    pub disable_f16: bool,
    pub disable_subgroups: bool,
    /// GPU memory the model may use, MiB (WebGPU does not report memory); checked before any
    /// weights are downloaded. `None`: only the adapter's binding limits are checked.
    pub gpu_mem_mib: Option<u64>,
    /// Compile the generation's kernels at load (`WebEngine::warm_up`). `None`: on a GPU, not
    /// on a CPU adapter (SwiftShader), where running the throwaway generation costs seconds.
    pub warm_up: Option<bool>,
    /// Greedy decoding's steps in flight (`Engine::set_decode_depth`), 1..=8; `PAGE_DEPTH`.
    pub decode_depth: usize,
}

impl Default for LoadSettings {
    fn default() -> Self {
        let load = LoadOptions::default();
        LoadSettings {
            cache: true,
            max_context: 2048,
            chunk_bytes: load.chunk_bytes,
            in_flight: load.in_flight,
            disable_f16: false,
            disable_subgroups: false,
            gpu_mem_mib: None,
            warm_up: None,
            decode_depth: PAGE_DEPTH,
        }
    }
}

impl LoadSettings {
    pub fn load_options(&self) -> Result<LoadOptions, WebError> {
        if self.chunk_bytes == 0 || self.chunk_bytes > MAX_CHUNK_BYTES {
            return Err(WebError::Options(format!(
                "chunkBytes {} must be 1..={MAX_CHUNK_BYTES}",
                self.chunk_bytes
            )));
        }
        if self.in_flight == 0 || self.in_flight > MAX_IN_FLIGHT {
            return Err(WebError::Options(format!(
                "inFlight {} must be 1..={MAX_IN_FLIGHT}",
                self.in_flight
            )));
        }
        Ok(LoadOptions {
            chunk_bytes: self.chunk_bytes,
            in_flight: self.in_flight,
        })
    }

    /// `decode_depth`, or an error saying its bounds.
    pub fn checked_decode_depth(&self) -> Result<usize, WebError> {
        match (1..=MAX_DEPTH).contains(&self.decode_depth) {
            true => Ok(self.decode_depth),
            false => Err(WebError::Options(format!(
                "decodeDepth must be a whole number from 1 to {MAX_DEPTH}, not {}",
                self.decode_depth
            ))),
        }
    }
}

/// `generate`/`chat` options, named as `runner generate`'s flags.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenerateSettings {
    pub n: u32,
    #[serde(alias = "temperature")]
    pub temp: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
    pub stop: Vec<String>,
    /// What the output must be: `{ type: "json" }`, `{ type: "json_schema", schema }`,
    /// `{ type: "regex", pattern }` or `{ type: "lark", grammar }` (`ConstraintSpec`).
    pub constraint: Option<ConstraintSpec>,
    /// `n` is a ceiling: generate at most what the context leaves after the prompt (what
    /// OpenAI's API does when `max_tokens` is absent).
    pub fit_context: bool,
    /// Speculative decoding, as `runner generate --spec`: `"lookup"` or absent.
    pub spec: Option<String>,
    /// Most draft tokens per step with `spec` (`--draft-max`).
    pub draft_max: Option<u32>,
    /// OpenAI `tools` entries (`{ type: "function", function: { name, parameters } }`),
    /// shown to the model through the chat template (chat only).
    pub tools: Vec<Value>,
    /// Constrain the answer to a call of one of `tools` (the page's `tool_choice`).
    pub tool_call: Option<ToolCallSettings>,
}

/// Which call the answer must (or may) be.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallSettings {
    /// Only this function (`tool_choice: { function: { name } }`); `None`: any of `tools`.
    pub function: Option<String>,
    /// Text may come instead of the call (`tool_choice: "auto"`).
    pub or_text: bool,
}

impl Default for GenerateSettings {
    /// `runner generate`'s defaults (llama.cpp's sampler chain).
    fn default() -> Self {
        let sampler = SamplerConfig::default();
        GenerateSettings {
            n: 128,
            temp: sampler.temperature,
            top_k: sampler.top_k,
            top_p: sampler.top_p,
            min_p: sampler.min_p,
            repeat_penalty: sampler.repeat_penalty,
            repeat_last_n: sampler.repeat_last_n,
            seed: sampler.seed,
            stop: Vec::new(),
            constraint: None,
            fit_context: false,
            spec: None,
            draft_max: None,
            tools: Vec::new(),
            tool_call: None,
        }
    }
}

impl GenerateSettings {
    pub fn options(&self) -> Result<GenerateOptions, WebError> {
        if self.n > MAX_TOKENS {
            return Err(WebError::Options(format!(
                "n {} is above {MAX_TOKENS}",
                self.n
            )));
        }
        let finite = [self.temp, self.top_p, self.min_p, self.repeat_penalty];
        if finite.iter().any(|v| !v.is_finite()) {
            return Err(WebError::Options(
                "sampler settings must be finite numbers".into(),
            ));
        }
        Ok(GenerateOptions {
            max_tokens: self.n,
            sampler: SamplerConfig {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repeat_penalty: self.repeat_penalty,
                repeat_last_n: self.repeat_last_n,
                frequency_penalty: 0.0,
                presence_penalty: 0.0,
                seed: self.seed,
            },
            stop: self.stop.clone(),
            constraint: self.checked_constraint()?,
            logprobs: None,
            speculation: self.speculation()?,
        })
    }

    /// The constraint, compiled once over bytes so a bad schema, regex or grammar is an
    /// options error before any work.
    fn checked_constraint(&self) -> Result<Option<ConstraintSpec>, WebError> {
        let spec = match (&self.tool_call, &self.constraint) {
            (Some(_), Some(_)) => {
                return Err(WebError::Options(
                    "constraint: a tool call and a constraint cannot both be asked".into(),
                ))
            }
            (Some(call), None) => Some(self.tool_call_constraint(call)?),
            (None, spec) => spec.clone(),
        };
        if let Some(spec) = &spec {
            spec.check()
                .map_err(|e| WebError::Options(format!("constraint: {e}")))?;
        }
        Ok(spec)
    }

    /// The Hermes-tagged call of the chosen functions, arguments held to their schemas (the
    /// HTTP API's `tool_plan` does the same).
    fn tool_call_constraint(&self, call: &ToolCallSettings) -> Result<ConstraintSpec, WebError> {
        let empty = json!({"type": "object", "properties": {}});
        let functions: Vec<(&str, &Value)> = self
            .tools
            .iter()
            .filter_map(|tool| {
                let function = tool.get("function")?;
                let name = function.get("name")?.as_str()?;
                let chosen = call.function.as_deref().is_none_or(|wanted| wanted == name);
                chosen.then(|| (name, function.get("parameters").unwrap_or(&empty)))
            })
            .collect();
        if functions.is_empty() {
            return Err(WebError::Options(
                "tools: no function in `tools` matches the tool call asked for".into(),
            ));
        }
        Ok(ConstraintSpec::hermes_tool_call(functions, call.or_text))
    }

    /// The speculation `spec` and `draft_max` ask for (`None`: plain decoding).
    fn speculation(&self) -> Result<Option<SpecConfig>, WebError> {
        match (self.spec.as_deref(), self.draft_max) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(WebError::Options("draft_max needs spec: \"lookup\"".into())),
            (Some(kind), draft_max) => {
                SpecConfig::named(kind, draft_max)
                    .map(Some)
                    .map_err(|err| match err {
                        SpecRequestError::Kind(why) => WebError::Options(format!("spec {why}")),
                        SpecRequestError::DraftMax(why) => WebError::Options(why),
                    })
            }
        }
    }

    /// The most tokens to generate after a prompt of `prompt_len` in a context of `context`:
    /// `n`, or with `fit_context` no more than the context leaves but at least one, so a
    /// prompt that fills the context still fails the generator's check that prompt and `n` fit.
    pub fn max_tokens(&self, prompt_len: usize, context: u32) -> u32 {
        match self.fit_context {
            true => self.n.min(context.saturating_sub(prompt_len as u32)).max(1),
            false => self.n,
        }
    }
}

/// Parses an options object; `undefined` and `null` give the defaults.
pub fn parse<T: for<'de> Deserialize<'de> + Default>(
    value: &JsValue,
    what: &str,
) -> Result<T, WebError> {
    if value.is_undefined() || value.is_null() {
        return Ok(T::default());
    }
    serde_wasm_bindgen::from_value(value.clone())
        .map_err(|e| WebError::Options(format!("{what}: {e}")))
}

/// A value as a plain JavaScript object (maps as objects, 64-bit integers as numbers).
pub fn to_js<T: Serialize>(value: &T) -> Result<JsValue, String> {
    let serializer = serde_wasm_bindgen::Serializer::json_compatible();
    value.serialize(&serializer).map_err(|e| e.to_string())
}
