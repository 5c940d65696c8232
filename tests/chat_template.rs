//! Chat templates against llama.cpp's goldens, plus the built-in formats' documented rules.

use crate::tokenizer_support;

use serde_json::json;
use tokenizer_support::{golden_models, load_tokenizer, read_generate};
use webshard::tokenizer::{ChatMessage, ChatTemplate, Tokenizer, ToolSupport, Vocab};

#[test]
fn chat_records_render_exactly() {
    let mut checked = 0;
    for model in golden_models() {
        let tokenizer = load_tokenizer(&model);
        let template = ChatTemplate::new(&tokenizer).expect("template");
        for record in read_generate(&model) {
            if record["kind"] != "chat" {
                continue;
            }
            let messages: Vec<ChatMessage> =
                serde_json::from_value(record["messages"].clone()).expect("messages");
            let rendered = template.render(&messages, true).expect("render");
            assert_eq!(
                rendered,
                record["rendered_template"]
                    .as_str()
                    .expect("rendered_template"),
                "{}: rendering",
                model.golden
            );
            // The prompt drops a leading BOS text exactly when the tokenizer adds BOS.
            let prompt = template.render_prompt(&messages, true).expect("prompt");
            assert_eq!(
                prompt,
                record["prompt"].as_str().expect("prompt"),
                "{}",
                model.golden
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} chat records found");
}

/// A tiny tokenizer whose only interesting metadata is the template and architecture.
fn tokenizer_with(template: Option<&str>, architecture: &str) -> Tokenizer {
    let tokens = ["<pad>", "<eos>", "<bos>", "a"];
    Tokenizer::from_vocab(Vocab {
        model: "llama".into(),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: vec![3, 3, 3, 1],
        bos_id: Some(2),
        eos_id: Some(1),
        add_bos: Some(true),
        chat_template: template.map(str::to_owned),
        architecture: Some(architecture.into()),
        ..Vocab::default()
    })
    .expect("tokenizer")
}

#[test]
fn gemma_builtin_merges_system_into_first_user_turn() {
    let template = ChatTemplate::new(&tokenizer_with(None, "gemma3")).expect("template");
    let messages = [
        ChatMessage::new("system", "  Be brief. "),
        ChatMessage::new("user", "Hi\n"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        template.render(&messages, true).expect("render"),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
         <start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    assert!(!template
        .render_prompt(&messages, false)
        .expect("prompt")
        .starts_with("<bos>"));
}

#[test]
fn jinja_templates_get_hf_helpers() {
    let source = "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('bad role') }}\
                  {% endif %}{{ m.content.strip().upper() }}{% if loop.last %}{% break %}{% endif %}\
                  |{% endfor %}{{ messages | tojson }}";
    let template = ChatTemplate::new(&tokenizer_with(Some(source), "llama")).expect("template");
    let rendered = template
        .render(
            &[
                ChatMessage::new("user", " hi "),
                ChatMessage::new("user", "yo"),
            ],
            false,
        )
        .expect("render");
    assert!(rendered.starts_with("HI|YO["), "{rendered}");
    assert!(rendered.contains("\"content\""), "{rendered}");
    let err = template
        .render(&[ChatMessage::new("bad", "x")], false)
        .expect_err("raise_exception fails the render");
    assert!(err.to_string().contains("bad role"), "{err}");
}

#[test]
fn broken_template_is_an_error_not_a_panic() {
    let err = ChatTemplate::new(&tokenizer_with(Some("{% for x in %}"), "llama"))
        .expect_err("syntax error");
    assert!(err.to_string().starts_with("chat template"), "{err}");
}

#[test]
fn runaway_template_is_stopped() {
    let source = "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}";
    let template = ChatTemplate::new(&tokenizer_with(Some(source), "llama")).expect("template");
    assert!(template.render(&[], false).is_err());
}

#[test]
fn qwen_renders_tools_calls_and_results_and_the_others_have_no_tools() {
    let models = golden_models();
    let support: Vec<ToolSupport> = models
        .iter()
        .map(|model| {
            ChatTemplate::new(&load_tokenizer(model))
                .expect("template")
                .tool_support()
        })
        .collect();
    // SmolLM2, Qwen2.5, Gemma 3, in golden_models' order.
    assert_eq!(
        support,
        [ToolSupport::None, ToolSupport::Hermes, ToolSupport::None]
    );
    let template = ChatTemplate::new(&load_tokenizer(&models[1])).expect("template");
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let call = ChatMessage {
        tool_calls: Some(json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}])),
        ..ChatMessage::new("assistant", "")
    };
    let result = ChatMessage {
        tool_call_id: Some("call_1".into()),
        ..ChatMessage::new("tool", "18 degrees")
    };
    let messages = [ChatMessage::new("user", "Weather in Paris?"), call, result];
    let rendered = template
        .render_with_tools(&messages, &[tool], true)
        .expect("render");
    assert!(rendered.contains("<tools>\n{"), "{rendered}");
    assert!(rendered.contains("\"get_weather\""), "{rendered}");
    assert!(
        rendered.contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
        "{rendered}"
    );
    assert!(
        rendered.contains("<tool_response>\n18 degrees\n</tool_response>"),
        "{rendered}"
    );
    assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered}");
    // Without tools, the same template renders as before (no tool system prompt).
    let plain = template.render(&messages[..1], true).expect("render");
    assert!(!plain.contains("<tools>"), "{plain}");
}
