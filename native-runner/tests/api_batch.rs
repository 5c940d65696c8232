//! Continuous batching through `runner serve -m` on SmolLM2: requests decoded together give
//! their lone results, constrained requests decode in the same batch, a cancelled stream frees
//! its slot, a shared system prompt is found in the prefix cache, and a lone request that asks
//! for drafts (`webshard_spec`) keeps some and answers as without them. One server for the whole binary; short prompts and few tokens.

use crate::api_support;
use crate::common;

use std::time::{Duration, Instant};

use api_support::{ApiServer, KEY};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;

const CTX: &str = "256";
const PARALLEL: &str = "16";
/// A step whose top-two logits are closer than this may go either way between the lone and
/// the batched kernels (different summation orders), and everything after it with it.
const NEAR_TIE: f64 = 0.5;

const PROMPTS: [&str; 16] = [
    "The capital of France is",
    "Water boils at",
    "One, two, three,",
    "The opposite of hot is",
    "My favourite fruit is the",
    "Once upon a time, in a small village by the sea, there lived",
    "The sun rises in the",
    "A week has seven",
    "Roses are red, violets are",
    "In the beginning",
    "The largest planet in our solar system is",
    "Cats and dogs are",
    "To make a cup of tea, first you",
    "The quick brown fox",
    "Monday, Tuesday,",
    "Python is a programming language that",
];

/// Where requests go: the server's address and model name (cloned into tasks).
#[derive(Clone)]
struct Target {
    base: String,
    model: String,
}

impl Target {
    fn of(server: &ApiServer) -> Target {
        Target {
            base: server.base.clone(),
            model: server.model.clone(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

/// One completion's tokens and, per token, the gap between its two most likely choices.
#[derive(Debug)]
struct Greedy {
    tokens: Vec<String>,
    margins: Vec<f64>,
    text: String,
}

async fn post(client: &Client, server: &Target, path: &str, body: Value) -> Value {
    let response = client
        .post(server.url(path))
        .bearer_auth(KEY)
        .json_body(&body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let text = response.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// reqwest without its `json` feature: the body set by hand.
trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(body.to_string())
    }
}

/// The tokens and top-two margins of a chat answer (`logprobs.content`) or a completion
/// (the legacy parallel lists, whose alternatives are a map: a margin of two tokens spelled
/// alike is taken as 0, a near-tie).
fn greedy_of(answer: &Value) -> Greedy {
    let choice = &answer["choices"][0];
    let text = choice["text"]
        .as_str()
        .or(choice["message"]["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let mut greedy = Greedy {
        tokens: Vec::new(),
        margins: Vec::new(),
        text,
    };
    let logprobs = &choice["logprobs"];
    if let Some(content) = logprobs["content"].as_array() {
        for token in content {
            let top: Vec<f64> = token["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap())
                .collect();
            greedy
                .tokens
                .push(token["token"].as_str().unwrap().to_string());
            greedy.margins.push(margin(top));
        }
        return greedy;
    }
    let tokens = logprobs["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs in {answer}"));
    for (token, top) in tokens
        .iter()
        .zip(logprobs["top_logprobs"].as_array().unwrap())
    {
        let top: Vec<f64> = top
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        greedy.tokens.push(token.as_str().unwrap().to_string());
        greedy.margins.push(margin(top));
    }
    greedy
}

fn margin(mut top: Vec<f64>) -> f64 {
    top.sort_by(|a, b| b.total_cmp(a));
    match top[..] {
        [first, second, ..] => first - second,
        _ => 0.0,
    }
}

async fn complete(client: &Client, server: &Target, prompt: &str, max_tokens: u32) -> Greedy {
    let body = json!({
        "model": server.model, "prompt": prompt, "max_tokens": max_tokens,
        "temperature": 0, "logprobs": 2,
    });
    greedy_of(&post(client, server, "v1/completions", body).await)
}

/// A greedy completion's text, without log-probabilities: such requests decode on the
/// device's argmax, with the next step submitted before the host has read this one.
async fn complete_text(client: &Client, server: &Target, prompt: &str, max_tokens: u32) -> String {
    let body = json!({
        "model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
    });
    let answer = post(client, server, "v1/completions", body).await;
    answer["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The tokens of `alone` before its first near-tie.
fn before_near_tie(alone: &Greedy) -> &[String] {
    let until = alone
        .margins
        .iter()
        .position(|&m| m <= NEAR_TIE)
        .unwrap_or(alone.tokens.len());
    &alone.tokens[..until]
}

/// `batched` equals `alone` up to and excluding the first near-tie of `alone`.
fn assert_same_until_near_tie(prompt: &str, alone: &Greedy, batched: &Greedy) {
    let until = before_near_tie(alone).len();
    assert!(
        batched.tokens.len() >= until,
        "{prompt:?}: batched {batched:?} ended before alone {alone:?}"
    );
    assert_eq!(
        alone.tokens[..until],
        batched.tokens[..until],
        "{prompt:?}: alone {alone:?}, batched {batched:?}"
    );
}

/// Sends every prompt at once (`max_tokens(index)` each) and returns the answers in order.
async fn all_at_once<T: Send + 'static, F>(
    server: &Target,
    max_tokens: fn(usize) -> u32,
    ask: fn(Client, Target, &'static str, u32) -> F,
) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
{
    let client = Client::new();
    let mut together = JoinSet::new();
    for (index, prompt) in PROMPTS.iter().enumerate() {
        let asked = ask(client.clone(), server.clone(), prompt, max_tokens(index));
        together.spawn(async move { (index, asked.await) });
    }
    let mut answers = together.join_all().await;
    answers.sort_by_key(|(index, _)| *index);
    answers.into_iter().map(|(_, answer)| answer).collect()
}

/// Sixteen requests decoded together give their lone answers: with log-probabilities (each
/// step's logits come back) and without (greedy on the device, steps chained ahead; the batch
/// changes as they finish at 6 and 8 tokens).
async fn sixteen_together_match_their_lone_runs(server: &Target) {
    let client = Client::new();
    let max_tokens = |index: usize| 6 + (index % 2) as u32 * 2;
    let mut alone = Vec::new();
    let timed = Instant::now();
    for (index, prompt) in PROMPTS.iter().enumerate() {
        alone.push(complete(&client, server, prompt, max_tokens(index)).await);
    }
    eprintln!("sixteen alone: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    let batched = all_at_once(
        server,
        max_tokens,
        |client, server, prompt, max_tokens| async move {
            complete(&client, &server, prompt, max_tokens).await
        },
    )
    .await;
    for ((prompt, batched), alone) in PROMPTS.iter().zip(&batched).zip(&alone) {
        assert_same_until_near_tie(prompt, alone, batched);
    }
    eprintln!("sixteen together: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    let chained = all_at_once(
        server,
        max_tokens,
        |client, server, prompt, max_tokens| async move {
            complete_text(&client, &server, prompt, max_tokens).await
        },
    )
    .await;
    eprintln!("sixteen chained: {:.1} s", timed.elapsed().as_secs_f64());
    for ((prompt, chained), alone) in PROMPTS.iter().zip(&chained).zip(&alone) {
        let agreed = before_near_tie(alone).concat();
        assert!(
            chained.starts_with(&agreed),
            "{prompt:?}: chained {chained:?}, alone {alone:?}"
        );
    }
}

async fn metric(client: &Client, server: &Target, name: &str) -> u64 {
    let text = client
        .get(server.url("metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{name}{{model=\"{}\"}} ", server.model);
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{prefix} missing from\n{text}"))
        .parse()
        .unwrap()
}

/// Polls `/metrics` until `name` satisfies `wanted` (a minute at most).
async fn wait_for_metric(
    client: &Client,
    server: &Target,
    name: &str,
    wanted: impl Fn(u64) -> bool,
) {
    let started = Instant::now();
    loop {
        let value = metric(client, server, name).await;
        if wanted(value) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name} stayed at {value}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Also: the running request holds the pages its prompt and `max_tokens` can fill, not a
/// whole context's.
async fn a_cancelled_stream_frees_its_slot(server: &Target) {
    let client = Client::new();
    let prompt = "Count from one to one hundred:";
    let probe = json!({ "model": server.model, "prompt": prompt, "max_tokens": 1 });
    let answer = post(&client, server, "v1/completions", probe).await;
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let pages = (prompt_tokens + 200).div_ceil(16);
    assert!(
        pages * 16 < CTX.parse::<u64>().unwrap(),
        "a test that cannot tell"
    );
    let body = json!({
        "model": server.model, "prompt": prompt,
        "max_tokens": 200, "temperature": 0, "stream": true,
    });
    let mut response = client
        .post(server.url("v1/completions"))
        .bearer_auth(KEY)
        .json_body(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let first = response.chunk().await.unwrap().expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    wait_for_metric(&client, server, "webshard_batch_size", |n| n == 1).await;
    wait_for_metric(&client, server, "webshard_kv_blocks_used", |n| n == pages).await;
    drop(response);
    wait_for_metric(&client, server, "webshard_batch_size", |n| n == 0).await;
    assert_eq!(metric(&client, server, "webshard_kv_blocks_used").await, 0);
    let next = complete(&client, server, "The sky is", 4).await;
    assert!(!next.tokens.is_empty(), "{next:?}");
}

/// Two schema-constrained chats (one greedy, one sampled) and two plain completions are sent
/// at once: all four run in one batch (a constrained request does not wait for the batch to
/// drain), each constrained answer holds to its schema (an enum of made-up words the model
/// would not write unasked) and ends with it, and the plain ones keep their lone answers.
async fn constrained_rows_decode_with_the_others(server: &Target) {
    let client = Client::new();
    let plain = &PROMPTS[..2];
    let mut alone = Vec::new();
    for prompt in plain {
        alone.push(complete(&client, server, prompt, 8).await);
    }
    let schema = json!({
        "type": "object",
        "properties": {"pet": {"enum": ["zebra-42", "quokka-7"]},
                       "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["pet", "count"], "additionalProperties": false,
    });
    let mut constrained = JoinSet::new();
    for temperature in [0.0, 1.0] {
        let body = json!({
            "model": server.model, "max_tokens": 24, "temperature": temperature, "seed": 5,
            "messages": [{"role": "user", "content": "Which pet, and how many?"}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "pet", "schema": schema}},
        });
        let (client, server) = (client.clone(), server.clone());
        constrained.spawn(async move { post(&client, &server, "v1/chat/completions", body).await });
    }
    let mut free = JoinSet::new();
    for (index, prompt) in plain.iter().enumerate() {
        let (client, server) = (client.clone(), server.clone());
        free.spawn(async move { (index, complete(&client, &server, prompt, 8).await) });
    }
    wait_for_metric(&client, server, "webshard_batch_size", |n| n == 4).await;
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");
    for answer in constrained.join_all().await {
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{answer}");
        let text = choice["message"]["content"].as_str().expect("content");
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(validator.is_valid(&value), "{text} against {schema}");
    }
    for (index, batched) in free.join_all().await {
        assert_same_until_near_tie(plain[index], &alone[index], &batched);
    }
}

/// A prompt whose continuation copies a span of it: drafts from the prompt are kept.
const REPEATS: &str = "Fruits: apple, banana, cherry, grape, lemon, mango, orange, peach, plum.\nThe same fruits again: apple,";

/// A lone request with `webshard_spec` verifies drafts of several tokens a step on its own
/// cache (the metrics count them, some kept) and its text is the plain answer's up to that
/// answer's first near-tie.
async fn a_lone_request_verifies_drafts(server: &Target) {
    let client = Client::new();
    let plain = complete(&client, server, REPEATS, 20).await;
    let drafted_before = metric(&client, server, "webshard_draft_tokens_total").await;
    let kept_before = metric(&client, server, "webshard_draft_accepted_tokens_total").await;
    let body = json!({
        "model": server.model, "prompt": REPEATS, "max_tokens": 20, "temperature": 0,
        "webshard_spec": {"type": "lookup", "draft_max": 6},
    });
    let answer = post(&client, server, "v1/completions", body).await;
    let text = answer["choices"][0]["text"].as_str().unwrap();
    let drafted = metric(&client, server, "webshard_draft_tokens_total").await - drafted_before;
    let kept = metric(&client, server, "webshard_draft_accepted_tokens_total").await - kept_before;
    assert!(
        kept >= 3 && drafted >= kept,
        "a continuation that copies its prompt keeps drafts: {kept} of {drafted} ({text:?})"
    );
    let details = &answer["usage"]["completion_tokens_details"];
    assert_eq!(details["accepted_prediction_tokens"], kept, "{answer}");
    assert_eq!(
        details["rejected_prediction_tokens"],
        drafted - kept,
        "{answer}"
    );
    let agreed: String = before_near_tie(&plain).concat();
    assert!(
        text.starts_with(&agreed),
        "with drafts {text:?}, plain {plain:?}"
    );
    assert!(agreed.contains("cherry"), "plain answer {plain:?}");
}

/// A long system prompt shared by two questions.
const SYSTEM: &str = "You are a careful assistant for a museum of natural history. You answer \
    questions about fossils, minerals and animals in one short, friendly sentence.";

async fn chat(client: &Client, server: &Target, question: &str) -> (Greedy, u64) {
    let body = json!({
        "model": server.model, "max_tokens": 6, "temperature": 0,
        "logprobs": true, "top_logprobs": 2,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
    });
    let answer = post(client, server, "v1/chat/completions", body).await;
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {answer}"));
    (greedy_of(&answer), cached)
}

async fn a_shared_system_prompt_hits_the_prefix_cache(server: &Target) {
    let client = Client::new();
    let (cold, cached_cold) = chat(&client, server, "What is amber?").await;
    assert_eq!(cached_cold, 0, "the pool starts empty");
    let (_, cached_other) = chat(&client, server, "How old are trilobites?").await;
    let (warm, cached_warm) = chat(&client, server, "What is amber?").await;
    // The system prompt alone is over 30 tokens; both later requests reuse at least it.
    assert!(cached_other >= 30, "{cached_other} cached tokens");
    assert!(cached_warm >= 30, "{cached_warm} cached tokens");
    assert_same_until_near_tie("What is amber?", &cold, &warm);
    assert!(!warm.text.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn batched_requests_keep_their_answers_slots_and_cached_prefixes() {
    let model = common::model_path(common::SMOLLM2);
    let server_process = ApiServer::start(
        model.to_str().unwrap(),
        "smollm2",
        &["--ctx", CTX, "--parallel", PARALLEL, "--queue", "32"],
    )
    .await;
    let server = Target::of(&server_process);
    let timed = Instant::now();
    a_shared_system_prompt_hits_the_prefix_cache(&server).await;
    eprintln!("prefix cache: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    a_lone_request_verifies_drafts(&server).await;
    eprintln!("drafts: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    a_cancelled_stream_frees_its_slot(&server).await;
    eprintln!("cancel: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    sixteen_together_match_their_lone_runs(&server).await;
    eprintln!("sixteen: {:.1} s", timed.elapsed().as_secs_f64());
    let timed = Instant::now();
    constrained_rows_decode_with_the_others(&server).await;
    eprintln!("constrained rows: {:.1} s", timed.elapsed().as_secs_f64());
    let client = Client::new();
    assert_eq!(metric(&client, &server, "webshard_kv_blocks_used").await, 0);
    assert_eq!(
        metric(&client, &server, "webshard_parallel_slots").await,
        16
    );
}
