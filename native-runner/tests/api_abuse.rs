//! The API under abuse: 64 concurrent streaming clients (some leaving mid-stream), malformed
//! JSON, wrong types, unknown fields, a 10 MB body, a prompt past the context, wrong keys,
//! bad schemas and tools (a schema that does not compile, one too big to compile, a
//! `tool_choice` naming no tool, tools for a template without them, penalties out of range).
//! Each gets its answer or its clear error, and the server keeps serving afterwards.

use crate::api_support;
use crate::common;

use api_support::{ApiServer, KEY};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;

const CLIENTS: usize = 64;
const QUEUE: &str = "3";
const CTX: &str = "128";

async fn post(client: &Client, server: &ApiServer, path: &str, body: String) -> reqwest::Response {
    client
        .post(server.url(path))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the server answers")
}

/// The status and the parsed `error` object of an error answer.
async fn error_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    let error = body["error"].clone();
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].is_string(), "{body}");
    (status, error)
}

fn chat_body(server: &ApiServer, content: &str, stream: bool) -> String {
    json!({
        "model": server.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": stream,
    })
    .to_string()
}

/// One streaming client: `Ok(true)` served to `[DONE]`, `Ok(false)` refused with 503
/// queue_full, after leaving early when `leave` says so.
async fn stream_client(client: Client, server_base: String, body: String, leave: bool) -> bool {
    let response = client
        .post(format!("{server_base}v1/chat/completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the server answers");
    match response.status() {
        StatusCode::OK => {}
        StatusCode::SERVICE_UNAVAILABLE => {
            let body: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
            assert_eq!(body["error"]["code"], "queue_full", "{body}");
            return false;
        }
        other => panic!("unexpected status {other}"),
    }
    let mut response = response;
    if leave {
        let first = response.chunk().await.unwrap().expect("a first chunk");
        assert!(String::from_utf8_lossy(&first).starts_with("data: "));
        return true; // dropping the response disconnects mid-stream
    }
    let text = response.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        text.contains("\"finish_reason\":\"length\"")
            || text.contains("\"finish_reason\":\"stop\""),
        "{text}"
    );
    true
}

async fn many_streams(server: &ApiServer) {
    let client = Client::new();
    let mut clients = JoinSet::new();
    for index in 0..CLIENTS {
        let body = chat_body(server, &format!("Count to {index}."), true);
        let leave = index % 3 == 0;
        clients.spawn(stream_client(
            client.clone(),
            server.base.clone(),
            body,
            leave,
        ));
    }
    let served = clients
        .join_all()
        .await
        .into_iter()
        .filter(|&served| served)
        .count();
    assert!(served >= 1, "no stream was served");
    assert!(
        served < CLIENTS,
        "a queue of {QUEUE} refused none of {CLIENTS}"
    );
    wait_idle(server).await;
}

/// Waits until the jobs of clients that left have drained: a departed client's queued job
/// still runs to its first token before it is cancelled, so a request sent at once could
/// meet a full queue (503) on a slow machine. Draining must take seconds, not minutes.
async fn wait_idle(server: &ApiServer) {
    let client = Client::new();
    let model = &server.model;
    let idle = [
        format!("webshard_queue_depth{{model=\"{model}\"}} 0"),
        format!("webshard_batch_size{{model=\"{model}\"}} 0"),
    ];
    let start = std::time::Instant::now();
    loop {
        let metrics = client
            .get(server.url("metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if idle.iter().all(|line| metrics.contains(line.as_str())) {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the departed clients' jobs did not drain in 60 s:\n{metrics}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn bad_requests(server: &ApiServer) {
    let client = Client::new();
    let model = &server.model;
    let cases: Vec<(String, &str)> = vec![
        ("{\"model\": ".to_string(), "body"),
        (json!({"model": 5, "messages": []}).to_string(), "model"),
        (json!({"model": model, "messages": "hi"}).to_string(), "messages"),
        (json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}).to_string(), "temperature"),
        (json!({"model": model, "messages": [{"role": "wizard", "content": "hi"}]}).to_string(), "messages[0].role"),
        (json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}).to_string(), "max_tokens"),
        (json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "n": 3}).to_string(), "n"),
        (json!({"model": model, "messages": []}).to_string(), "messages"),
        (json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "webshard_spec": {"type": "ngram"}}).to_string(), "webshard_spec.type"),
        (json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "webshard_spec": {"type": "lookup", "draft_max": 99}}).to_string(), "webshard_spec.draft_max"),
    ];
    for (body, param) in cases {
        let (status, error) =
            error_of(post(&client, server, "v1/chat/completions", body.clone()).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error["param"], param, "{body}: {error}");
    }
    let unknown = json!({"model": model, "messages": [], "frobnicate": true}).to_string();
    let (status, error) =
        error_of(post(&client, server, "v1/chat/completions", unknown).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error["message"].as_str().unwrap().contains("frobnicate"),
        "{error}"
    );

    let past_context = chat_body(server, &"word ".repeat(400), false);
    let (status, error) =
        error_of(post(&client, server, "v1/chat/completions", past_context).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["code"], "context_length_exceeded", "{error}");
    let ids: Vec<u32> = vec![1; 126];
    let completion = json!({"model": model, "prompt": ids, "max_tokens": 10}).to_string();
    let (status, error) = error_of(post(&client, server, "v1/completions", completion).await).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error["code"], "context_length_exceeded", "{error}");

    let unknown_model = json!({"model": "nope", "prompt": "hi"}).to_string();
    let (status, error) =
        error_of(post(&client, server, "v1/completions", unknown_model).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error["code"], "model_not_found");

    let huge = chat_body(server, &"x".repeat(10 << 20), false);
    let answer = post_raw(server, "/v1/chat/completions", huge.into_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "a 10 MB body: {}",
        &answer[..answer.len().min(300)]
    );
    assert!(
        answer.contains("\"error\""),
        "413 in OpenAI's shape: {answer}"
    );
}

/// A chat body of one short question with `extra` fields.
fn chat_with(server: &ApiServer, extra: Value) -> String {
    let mut body = json!({
        "model": server.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "temperature": 0,
    });
    for (key, value) in extra.as_object().expect("fields") {
        body[key] = value.clone();
    }
    body.to_string()
}

/// Bad structured-output and tool requests: each a 400 naming its field, none a panic.
async fn bad_structured_requests(server: &ApiServer) {
    let client = Client::new();
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let huge_schema = json!({"type": "object", "properties": (0..3000)
        .map(|i| (format!("field_{i}"), json!({"type": "string"})))
        .collect::<serde_json::Map<String, Value>>()});
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "wat"}}}}),
            "response_format.json_schema.schema",
            "wat",
        ),
        (
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}}),
            "response_format.json_schema.schema",
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": huge_schema}}}),
            "response_format.json_schema.schema",
            "bytes",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            "xml",
        ),
        (
            json!({"tools": weather, "tool_choice": {"type": "function",
            "function": {"name": "launch_rockets"}}}),
            "tool_choice.function.name",
            "launch_rockets",
        ),
        (json!({"tools": weather}), "tools", "has no tools"),
        (
            json!({"tools": weather, "tool_choice": "required"}),
            "tools",
            "has no tools",
        ),
        (json!({"tool_choice": "required"}), "tool_choice", "empty"),
        (
            json!({"frequency_penalty": 2.5}),
            "frequency_penalty",
            "between",
        ),
        (
            json!({"presence_penalty": -3}),
            "presence_penalty",
            "between",
        ),
    ];
    for (extra, param, says) in cases {
        let body = chat_with(server, extra);
        let (status, error) =
            error_of(post(&client, server, "v1/chat/completions", body.clone()).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error["param"], param, "{body}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(says), "{param}: {message}");
    }
    // `tool_choice: none` on a template without tools is plain chat.
    let none = chat_with(server, json!({"tools": weather, "tool_choice": "none"}));
    let answer = post(&client, server, "v1/chat/completions", none).await;
    assert_eq!(answer.status(), StatusCode::OK);
}

/// Sends a POST over a plain socket and reads the answer while the body is still going out:
/// a server that refuses an oversized body answers 413 and closes the connection before the
/// client has written it all, which HTTP clients such as reqwest report as a broken pipe
/// instead of the answer. Write errors are therefore expected here; the answer is what counts.
async fn post_raw(server: &ApiServer, path: &str, body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let url = reqwest::Url::parse(&server.url("")).expect("server url");
    let address = format!(
        "{}:{}",
        url.host_str().expect("host"),
        url.port().expect("port")
    );
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let sending = tokio::spawn(async move {
        let _ = writer.write_all(head.as_bytes()).await;
        let _ = writer.write_all(&body).await;
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        reader.read_to_end(&mut answer),
    )
    .await
    .expect("an answer within 30 s");
    // A reset after the answer arrived still leaves the answer in the buffer.
    if answer.is_empty() {
        read.expect("read the answer");
    }
    sending.abort();
    String::from_utf8_lossy(&answer).into_owned()
}

async fn bad_keys(server: &ApiServer) {
    let client = Client::new();
    let body = chat_body(server, "hi", false);
    for key in [
        None,
        Some("wrong"),
        Some("test-key-012345678"),
        Some("test-key-01234567890"),
    ] {
        let mut request = client
            .post(server.url("v1/chat/completions"))
            .body(body.clone());
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let (status, error) = error_of(request.send().await.unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{key:?}");
        assert_eq!(error["code"], "invalid_api_key");
    }
}

/// After everything: healthy, idle, and still answering.
async fn still_serving(server: &ApiServer) {
    let client = Client::new();
    let health = client.get(server.url("health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let answer = post(
        &client,
        server,
        "v1/chat/completions",
        chat_body(server, "Say hi.", false),
    )
    .await;
    assert_eq!(answer.status(), StatusCode::OK);
    let answer: Value = serde_json::from_str(&answer.text().await.unwrap()).unwrap();
    assert!(
        answer["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    let metrics = client
        .get(server.url("metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let model = &server.model;
    for line in [
        format!("webshard_queue_depth{{model=\"{model}\"}} 0"),
        format!("webshard_batch_size{{model=\"{model}\"}} 0"),
        format!("webshard_kv_blocks_used{{model=\"{model}\"}} 0"),
        format!("webshard_model_ready{{model=\"{model}\"}} 1"),
        "webshard_http_responses_total{status=\"503\"}".to_string(),
        "webshard_http_responses_total{status=\"413\"}".to_string(),
    ] {
        assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn abuse_gets_clear_errors_and_the_server_keeps_serving() {
    let model = common::model_path(common::SMOLLM2);
    let server = ApiServer::start(
        model.to_str().unwrap(),
        "smollm2",
        &["--ctx", CTX, "--queue", QUEUE],
    )
    .await;
    many_streams(&server).await;
    bad_requests(&server).await;
    bad_structured_requests(&server).await;
    bad_keys(&server).await;
    still_serving(&server).await;
}
