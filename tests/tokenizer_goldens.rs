//! The tokenizer against llama.cpp's goldens for the three real models: every tokenize line,
//! every generate prompt, and the decoded text of every generated continuation.

use crate::tokenizer_support;

use tokenizer_support::{
    golden_models, ids_of, load_tokenizer, read_generate, read_tokenize_lines,
};

#[test]
fn tokenize_lines_match_llama_cpp() {
    for model in golden_models() {
        let tokenizer = load_tokenizer(&model);
        let lines = read_tokenize_lines(&model);
        assert!(!lines.is_empty(), "{}: no tokenize goldens", model.golden);
        let mut mismatches = Vec::new();
        for line in &lines {
            let text = line["text"].as_str().expect("text");
            let want = ids_of(&line["ids"]);
            let got = tokenizer.encode(text, true, false);
            if got != want {
                mismatches.push(format!("{text:?}\n  got  {got:?}\n  want {want:?}"));
            }
        }
        assert!(
            mismatches.is_empty(),
            "{}: {} of {} lines differ:\n{}",
            model.golden,
            mismatches.len(),
            lines.len(),
            mismatches.join("\n")
        );
    }
}

#[test]
fn generate_prompts_encode_with_special_tokens() {
    for model in golden_models() {
        let tokenizer = load_tokenizer(&model);
        let records = read_generate(&model);
        assert!(!records.is_empty(), "{}: no generate records", model.golden);
        for record in &records {
            let prompt = record["prompt"].as_str().expect("prompt");
            assert_eq!(
                tokenizer.encode(prompt, true, true),
                ids_of(&record["prompt_ids"]),
                "{}: prompt {prompt:?}",
                model.golden
            );
        }
    }
}

#[test]
fn golden_continuations_decode_to_their_text() {
    for model in golden_models() {
        let tokenizer = load_tokenizer(&model);
        for record in read_generate(&model) {
            let ids: Vec<u32> = record["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|step| step["id"].as_u64().expect("step id") as u32)
                .collect();
            assert!(!ids.is_empty(), "{}: record without steps", model.golden);
            assert_eq!(
                tokenizer.decode(&ids),
                record["text"].as_str().expect("text"),
                "{}: continuation of {:?}",
                model.golden,
                record["prompt"]
            );
        }
    }
}

#[test]
fn end_of_generation_ids_are_the_models_end_tokens() {
    for model in golden_models() {
        let tokenizer = load_tokenizer(&model);
        let eos = tokenizer.eos_id().expect("every model has an EOS");
        assert!(tokenizer.is_eog(eos), "{}: EOS is EOG", model.golden);
        let end_of_turn = ["<|im_end|>", "<end_of_turn>"]
            .iter()
            .find_map(|text| tokenizer.token_id(text))
            .expect("a chat end-of-turn token");
        assert!(
            tokenizer.is_eog(end_of_turn),
            "{}: end of turn",
            model.golden
        );
        let plain = tokenizer.encode("Hello", false, false);
        assert!(
            plain.iter().all(|&id| !tokenizer.is_eog(id)),
            "{}",
            model.golden
        );
        // Generation in the goldens stops at end-of-generation, so no golden step is one
        // except possibly the last.
        for record in read_generate(&model) {
            let steps = record["steps"].as_array().expect("steps");
            for step in &steps[..steps.len().saturating_sub(1)] {
                let id = step["id"].as_u64().expect("id") as u32;
                assert!(!tokenizer.is_eog(id), "{}: step {id} is EOG", model.golden);
            }
        }
    }
}

#[test]
fn gemma_vocab_loads_and_encodes_fast_enough() {
    let model = golden_models()
        .into_iter()
        .find(|m| m.golden.starts_with("gemma"))
        .expect("gemma in the model list");
    let metadata = tokenizer_support::read_metadata(&model);
    let start = std::time::Instant::now();
    let tokenizer = webshard::tokenizer::Tokenizer::from_metadata(&metadata).expect("tokenizer");
    let load = start.elapsed();
    assert_eq!(tokenizer.vocab_size(), 262_144);
    let text: String = include_str!("../src/tokenizer/mod.rs")
        .chars()
        .take(1024)
        .collect();
    let start = std::time::Instant::now();
    let ids = tokenizer.encode(&text, true, true);
    let encode = start.elapsed();
    eprintln!(
        "gemma: vocab load {load:?}, 1 KiB encode {encode:?} ({} ids)",
        ids.len()
    );
    // Generous bounds that still catch an accidentally quadratic path, even unoptimized.
    assert!(load.as_secs_f64() < 5.0, "load took {load:?}");
    assert!(encode.as_secs_f64() < 0.5, "encode took {encode:?}");
    assert_eq!(tokenizer.decode(&ids[1..]), text, "round trip");
}
