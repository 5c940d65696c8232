//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and strict
//! parsing of request bodies into them.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An error answer: its status and OpenAI's four fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorFields<'a>,
}

#[derive(Serialize)]
struct ErrorFields<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 for a field whose value cannot be honoured.
    pub fn bad_field(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn context_length(message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some("messages".to_string()),
            code: Some("context_length_exceeded"),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "Incorrect or missing API key: send `Authorization: Bearer KEY` with the key given to --api-key",
            )
        }
    }

    pub fn unknown_model(name: &str) -> ApiError {
        ApiError {
            param: Some("model".to_string()),
            code: Some("model_not_found"),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{name}` does not exist; GET /v1/models lists the served ones"),
            )
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("The request body is larger than {limit} bytes"),
            )
        }
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some(code),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body alone, for an error that arrives inside an event stream.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(ErrorBody {
            error: ErrorFields {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .expect("an error body serializes")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

/// Parses a JSON body strictly; a wrong type or unknown field is a 400 naming its path
/// (`messages[0].content`), an oversized body a 413.
pub fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(limit),
        _ => ApiError::bad_field("body", format!("Could not read the body: {rejection}")),
    })?;
    let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut deserializer);
    let value = parsed.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::bad_field("body", format!("The body is not valid JSON: {inner}"));
        }
        let param = if path == "." { "body" } else { path.as_str() };
        ApiError::bad_field(param, format!("Invalid `{param}`: {inner}"))
    })?;
    deserializer.end().map_err(|err| {
        ApiError::bad_field("body", format!("Trailing data after the JSON: {err}"))
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // fields only exist to be parsed
    struct Probe {
        name: String,
        items: Vec<Item>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        weight: f32,
    }

    fn parse(text: &str) -> Result<Probe, ApiError> {
        parse_body(Ok(Bytes::from(text.to_string())), 1024)
    }

    #[test]
    fn wrong_types_and_unknown_fields_name_their_path() {
        let err = parse(r#"{"name": "a", "items": [{"weight": "heavy"}]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("items[0].weight"));
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let err = parse(r#"{"name": "a", "items": [], "extra": 1}"#).unwrap_err();
        assert!(err.message.contains("extra"), "{}", err.message);
        let err = parse(r#"{"name": "a""#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("body"));
        assert!(err.message.contains("not valid JSON"), "{}", err.message);
        assert!(parse(r#"{"name": "a", "items": [{"weight": 1}]}"#).is_ok());
    }

    #[test]
    fn the_body_has_openai_fields() {
        let body = ApiError::unknown_model("nope").body();
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].as_str().unwrap().contains("nope"));
    }
}
