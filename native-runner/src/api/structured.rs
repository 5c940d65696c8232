//! `response_format` and `tools`/`tool_choice` onto the front door: a `ConstraintSpec` in
//! `GenerateOptions.constraint`, and for tools the definitions the chat template shows the
//! model (`Prompt::ToolChat`). Every schema is compiled here, before the job is queued, so a
//! bad one is a 400 naming its field with llguidance's reason; a compiler panic is contained
//! the same way.

use std::collections::HashSet;

use serde_json::{json, Value};
use webshard::sample::ConstraintSpec;
use webshard::tokenizer::ToolSupport;

use super::errors::ApiError;
use super::types::{ResponseFormat, Tool, ToolChoice};
use super::worker::guarded;

/// Largest schema (as JSON text) compiled per field: compiling is CPU work done for every
/// request, so an attacker's schema must stay small.
pub const MAX_SCHEMA_BYTES: usize = 32 << 10;
/// Most tools one request may define.
pub const MAX_TOOLS: usize = 64;
/// OpenAI's rule for function names (which also keeps them free of JSON escapes).
const MAX_NAME_CHARS: usize = 64;

/// The constraint `response_format` asks for; `None` for text.
pub fn response_constraint(
    format: Option<&ResponseFormat>,
) -> Result<Option<ConstraintSpec>, ApiError> {
    let Some(format) = format else {
        return Ok(None);
    };
    match format.kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(ConstraintSpec::json_object())),
        "json_schema" => {
            let Some(spec) = &format.json_schema else {
                return Err(ApiError::bad_field(
                    "response_format.json_schema",
                    "`response_format.json_schema` is required with `type: json_schema`",
                ));
            };
            let schema = spec.schema.clone().unwrap_or_else(|| json!({}));
            let param = "response_format.json_schema.schema";
            checked_schema(param, &schema)?;
            Ok(Some(ConstraintSpec::JsonSchema { schema }))
        }
        other => Err(ApiError::bad_field(
            "response_format.type",
            format!(
                "`response_format.type` `{other}` is not one of text, json_object, json_schema"
            ),
        )),
    }
}

/// What `tools` and `tool_choice` make of a chat request.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The definitions, as the template receives them.
    pub tools: Vec<Value>,
    /// The output: a call (`required`, one function) or text or a call (`auto`).
    pub constraint: ConstraintSpec,
}

/// `tool_choice` read.
enum Choice<'a> {
    None,
    Auto,
    Required,
    Function(&'a str),
}

/// The tools to show and the call constraint; `None` when no call can be made (no tools, or
/// `tool_choice: none`, whose answer is plain text without the tools in the prompt).
pub fn tool_plan(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    support: ToolSupport,
    model: &str,
) -> Result<Option<ToolPlan>, ApiError> {
    let tools = tools.unwrap_or_default();
    let choice = read_choice(choice, tools)?;
    if tools.is_empty() || matches!(choice, Choice::None) {
        return Ok(None);
    }
    check_tools(tools)?;
    match support {
        ToolSupport::Hermes => {}
        ToolSupport::None => {
            return Err(ApiError::bad_field(
                "tools",
                format!("the chat template of model `{model}` has no tools (it never shows them to the model); send no `tools` or `tool_choice: \"none\"`"),
            ))
        }
        ToolSupport::Other => {
            return Err(ApiError::bad_field(
                "tools",
                format!("the chat template of model `{model}` writes tool calls in a format this server cannot constrain (only Hermes' <tool_call> tags)"),
            ))
        }
    }
    let empty = json!({"type": "object", "properties": {}});
    let functions = tools.iter().filter_map(|tool| {
        let name = tool.function.name.as_str();
        let chosen = match choice {
            Choice::Function(wanted) => wanted == name,
            _ => true,
        };
        chosen.then(|| (name, tool.function.parameters.as_ref().unwrap_or(&empty)))
    });
    let constraint = ConstraintSpec::hermes_tool_call(functions, matches!(choice, Choice::Auto));
    checked_constraint("tools", &constraint)?;
    let tools = tools
        .iter()
        .map(|tool| serde_json::to_value(tool).expect("tools serialize"))
        .collect();
    Ok(Some(ToolPlan { tools, constraint }))
}

fn read_choice<'a>(choice: Option<&'a ToolChoice>, tools: &[Tool]) -> Result<Choice<'a>, ApiError> {
    let choice = match choice {
        None => Choice::Auto,
        Some(ToolChoice::Mode(mode)) => match mode.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::bad_field(
                    "tool_choice",
                    format!(
                        "`tool_choice` `{other}` is not one of none, auto, required or a function"
                    ),
                ))
            }
        },
        Some(ToolChoice::Function(named)) => {
            if named.kind != "function" {
                return Err(ApiError::bad_field(
                    "tool_choice.type",
                    format!("`tool_choice.type` `{}` is not `function`", named.kind),
                ));
            }
            let name = named.function.name.as_str();
            if !tools.iter().any(|tool| tool.function.name == name) {
                return Err(ApiError::bad_field(
                    "tool_choice.function.name",
                    format!("`tool_choice` names the function `{name}`, which is not in `tools`"),
                ));
            }
            Choice::Function(name)
        }
    };
    if tools.is_empty() && matches!(choice, Choice::Required | Choice::Function(_)) {
        return Err(ApiError::bad_field(
            "tool_choice",
            "`tool_choice` asks for a call but `tools` is empty",
        ));
    }
    Ok(choice)
}

fn check_tools(tools: &[Tool]) -> Result<(), ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::bad_field(
            "tools",
            format!("at most {MAX_TOOLS} tools per request, got {}", tools.len()),
        ));
    }
    let mut names = HashSet::new();
    for (index, tool) in tools.iter().enumerate() {
        if tool.kind != "function" {
            return Err(ApiError::bad_field(
                &format!("tools[{index}].type"),
                format!("tool type `{}` is not supported (function only)", tool.kind),
            ));
        }
        let name = tool.function.name.as_str();
        let param = format!("tools[{index}].function.name");
        if !valid_name(name) {
            return Err(ApiError::bad_field(
                &param,
                format!("function names are 1 to {MAX_NAME_CHARS} of a-z, A-Z, 0-9, _ and -; got `{name}`"),
            ));
        }
        if !names.insert(name) {
            return Err(ApiError::bad_field(
                &param,
                format!("the function `{name}` is defined twice"),
            ));
        }
        if let Some(parameters) = &tool.function.parameters {
            checked_schema(&format!("tools[{index}].function.parameters"), parameters)?;
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A schema that is small enough and compiles.
fn checked_schema(param: &str, schema: &Value) -> Result<(), ApiError> {
    let size = schema.to_string().len();
    if size > MAX_SCHEMA_BYTES {
        return Err(ApiError::bad_field(
            param,
            format!("`{param}` is {size} bytes of JSON; at most {MAX_SCHEMA_BYTES} are compiled"),
        ));
    }
    let spec = ConstraintSpec::JsonSchema {
        schema: schema.clone(),
    };
    checked_constraint(param, &spec)
}

/// Compiles `spec` (over single bytes: no model needed) and names `param` when it fails.
fn checked_constraint(param: &str, spec: &ConstraintSpec) -> Result<(), ApiError> {
    let compiled = guarded(|| spec.check()).map_err(|_| {
        ApiError::bad_field(param, format!("`{param}` made the schema compiler fail"))
    })?;
    compiled.map_err(|err| ApiError::bad_field(param, format!("`{param}`: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, parameters: Value) -> Tool {
        serde_json::from_value(json!({"type": "function",
            "function": {"name": name, "parameters": parameters}}))
        .expect("a tool")
    }

    fn param_of(err: ApiError) -> String {
        err.param.expect("a named field")
    }

    #[test]
    fn bad_schemas_and_choices_name_their_field() {
        let format: ResponseFormat = serde_json::from_value(json!({"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "wat"}}}))
        .unwrap();
        let err = response_constraint(Some(&format)).unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("response_format.json_schema.schema")
        );
        assert!(err.message.contains("wat"), "{}", err.message);
        let huge = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        let tools = [tool("f", huge)];
        let err = tool_plan(Some(&tools), None, ToolSupport::Hermes, "m").unwrap_err();
        assert_eq!(param_of(err), "tools[0].function.parameters");
        let tools = [tool("f", json!({"type": "object"}))];
        let named: ToolChoice = serde_json::from_value(json!({"type": "function",
            "function": {"name": "g"}}))
        .unwrap();
        let err = tool_plan(Some(&tools), Some(&named), ToolSupport::Hermes, "m").unwrap_err();
        assert_eq!(param_of(err), "tool_choice.function.name");
        let err = tool_plan(Some(&tools), None, ToolSupport::None, "m").unwrap_err();
        assert!(err.message.contains("has no tools"), "{}", err.message);
        let none = ToolChoice::Mode("none".into());
        assert!(tool_plan(Some(&tools), Some(&none), ToolSupport::None, "m")
            .unwrap()
            .is_none());
        let bad = [tool("no spaces", json!({}))];
        let err = tool_plan(Some(&bad), None, ToolSupport::Hermes, "m").unwrap_err();
        assert_eq!(param_of(err), "tools[0].function.name");
    }

    #[test]
    fn small_but_explosive_schemas_end_in_an_answer() {
        let schemas = [
            json!({"type": "string", "minLength": 1_000_000, "maxLength": 2_000_000}),
            json!({"type": "array", "items": {"type": "string", "maxLength": 100_000},
                "minItems": 100_000}),
            json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
                "$ref": "#/$defs/a"}),
            json!({"type": "integer", "minimum": 1e300, "maximum": -1e300}),
        ];
        for schema in schemas {
            let format: ResponseFormat = serde_json::from_value(json!({"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema}}))
            .unwrap();
            if let Err(err) = response_constraint(Some(&format)) {
                assert_eq!(
                    err.param.as_deref(),
                    Some("response_format.json_schema.schema")
                );
            }
        }
    }

    #[test]
    fn required_and_auto_compile_to_call_grammars() {
        let tools = [tool(
            "get_weather",
            json!({"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        )];
        for mode in ["auto", "required"] {
            let choice = ToolChoice::Mode(mode.into());
            let plan = tool_plan(Some(&tools), Some(&choice), ToolSupport::Hermes, "m")
                .unwrap()
                .expect("a plan");
            assert_eq!(plan.tools[0]["function"]["name"], "get_weather");
            let ConstraintSpec::Lark { grammar } = &plan.constraint else {
                panic!("{:?}", plan.constraint)
            };
            assert_eq!(grammar.contains("TEXT"), mode == "auto", "{grammar}");
        }
    }
}
