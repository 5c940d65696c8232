#!/usr/bin/env python3
"""Generation and tokenizer goldens from llama.cpp (through llama-cpp-python) for one GGUF file.

Writes OUT/<NAME>.tokenize.jsonl and OUT/<NAME>.generate.json (OUT defaults to the folder of
this script) in the format ../shared/goldens/README.md defines:
  - tokenize: one {"text", "ids"} line per text, llama_tokenize(add_special=true,
    parse_special=false);
  - generate: records of {"prompt", "prompt_ids", "kind", "steps", "text"} (chat records add
    "messages", "rendered_template", "template_source"); each step is the greedy id and the
    top-5 [id, logit] pairs of the raw final logits. The prompt is evaluated in one batch, then
    each chosen token one at a time (incremental, as the shared goldens were made), CPU
    backend, 2 threads. Decoding stops at an end-of-generation token or after --steps.

Usage: python3 tests/goldens/make_goldens.py MODEL.gguf NAME [--out DIR] [--steps N]
Needs llama-cpp-python==0.3.36 (it builds llama.cpp from source on pip install:
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
-DGGML_AMX_BF16=OFF" MAKEFLAGS=-j1 pip install llama-cpp-python==0.3.36).
It prints the median top-1 margin over all steps (the issue asks >= 1.0 for the small
random-weight models, so that the top-1 check has teeth).
"""

import argparse
import hashlib
import json
import statistics
from pathlib import Path

import numpy as np

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

HERE = Path(__file__).resolve().parent

# The texts of the shared tokenize goldens: whitespace runs, contractions, digits, accents,
# several scripts, emoji, code, markup, URLs, invisible characters, special-token look-alikes
# (tokenized as plain text here), and the empty string.
TOKENIZE_TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world",
    "hello\nworld\n\n",
    "\tindented\ttabs",
    "   leading spaces",
    "trailing spaces   ",
    "I'm can't won't they'll we've he'd",
    "UPPER lower MiXeD",
    "12345 678 9.01 1e-5 3,000,000",
    "2026-11-30T01:45:00Z",
    "naïve café résumé",
    "Größe straße",
    "日本語のテキスト",
    "中文文本测试",
    "한국어 텍스트",
    "Привет, мир!",
    "مرحبا بالعالم",
    "emoji 😀🎉👍🏽 flags 🇫🇷",
    "math: ∑ ∫ √ ≤ ≥ ≠ ∞",
    'fn main() {\n    println!("hi");\n}\n',
    "def f(x):\n\treturn x**2  # square\n",
    '<html><body class="x">&amp;</body></html>',
    "a" * 50,
    "!!!???...,,,;;;",
    "http://example.com/path?q=1&r=2#frag",
    "user@example.com",
    "\u00a0non-breaking\u00a0space",
    "zero\u200bwidth",
    "mixed 123abc456 def789",
    "<|im_start|>user hello<|im_end|>",
    "<start_of_turn>user",
    "",
    " ",
    "\n",
    "The quick brown fox jumps over the lazy dog.",
]

TEXT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
]
CHAT_MESSAGES = [{"role": "user", "content": "What is 12 times 7?"}]


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def last_logits(llm):
    pointer = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).astype(np.float64)


def greedy_steps(llm, prompt_ids, n_steps):
    """Greedy decoding with the raw top-5 logits of each step."""
    llm.reset()
    llm.eval(prompt_ids)
    steps = []
    for _ in range(n_steps):
        logits = last_logits(llm)
        top = np.argsort(-logits, kind="stable")[:5]
        chosen = int(top[0])
        steps.append(
            {"id": chosen, "top5": [[int(i), round(float(logits[i]), 4)] for i in top]}
        )
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, chosen):
            break
        llm.eval([chosen])
    return steps


def record(llm, prompt, n_steps):
    prompt_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    steps = greedy_steps(llm, prompt_ids, n_steps)
    ids = [s["id"] for s in steps]
    text = llm.detokenize(ids).decode("utf-8", errors="replace")
    return {"prompt": prompt, "prompt_ids": prompt_ids, "steps": steps, "text": text}


def chat_record(llm, n_steps):
    template = llm.metadata.get("tokenizer.chat_template")
    if template is None:
        return None
    model = llm._model
    bos = model.token_get_text(model.token_bos())
    eos = model.token_get_text(model.token_eos())
    formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
    rendered = formatter(messages=CHAT_MESSAGES).prompt
    prompt = rendered
    if model.add_bos_token() and prompt.startswith(bos):
        prompt = prompt[len(bos) :]
    out = record(llm, prompt, n_steps)
    out.update(
        kind="chat",
        messages=CHAT_MESSAGES,
        rendered_template=rendered,
        template_source="tokenizer.chat_template",
    )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("name")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()

    llm = Llama(
        model_path=str(args.model),
        n_ctx=1024,
        n_batch=512,
        n_threads=2,
        n_threads_batch=2,
        n_gpu_layers=0,
        verbose=False,
    )
    tokenize_lines = [
        {"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=True, special=False)}
        for t in TOKENIZE_TEXTS
    ]
    records = []
    for prompt in TEXT_PROMPTS:
        records.append(record(llm, prompt, args.steps) | {"kind": "text"})
    chat = chat_record(llm, args.steps)
    if chat is not None:
        records.append(chat)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.name}.tokenize.jsonl", "w", encoding="utf-8") as f:
        for line in tokenize_lines:
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    golden = {
        "model": args.name,
        "model_file": args.model.name,
        "model_sha256": sha256_of(args.model),
        "producer": f"llama-cpp-python {llama_cpp.__version__}, CPU backend, 2 threads",
        "n_predict": args.steps,
        "records": records,
    }
    path = args.out / f"{args.name}.generate.json"
    path.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    margins = [s["top5"][0][1] - s["top5"][1][1] for r in records for s in r["steps"]]
    print(
        f"wrote {path} ({len(records)} records, {len(margins)} steps, "
        f"median top-1 margin {statistics.median(margins):.3f})"
    )


if __name__ == "__main__":
    main()
