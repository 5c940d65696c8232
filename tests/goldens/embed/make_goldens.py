#!/usr/bin/env python3
"""Embedding goldens from llama.cpp (through llama-cpp-python) for one GGUF file.

Writes tests/goldens/embed/<name>.json in the format README.md beside this file describes:
for each text, llama.cpp's token ids and its pooled, unnormalised embedding.

Usage: python3 tests/goldens/embed/make_goldens.py MODEL.gguf NAME [POOLING]
POOLING (mean, cls or last) overrides the GGUF's pooling type, as llama.cpp's `--pooling` does:
a causal decoder states none, and llama.cpp then gives per-token vectors only.
Needs llama-cpp-python==0.3.36 (it builds llama.cpp from source on pip install:
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
-DGGML_AMX_BF16=OFF" MAKEFLAGS=-j1 pip install llama-cpp-python==0.3.36).
"""

import hashlib
import json
import sys
from pathlib import Path

import llama_cpp
from llama_cpp import Llama

HERE = Path(__file__).resolve().parent
POOLING_CODES = {"mean": 1, "cls": 2, "last": 3}

# Plain sentences, case and punctuation, accents, CJK, digits and symbols, an emoji (unknown
# to the vocabulary), a [SEP]-looking text (not parsed as special), whitespace runs, and one
# long input.
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "WebGPU runs the same kernels natively and in the browser!",
    "Héllo, wörld: naïve café déjà vu.",
    "東京は日本の首都です。",
    "Prices rose 3.5% to $1,234.56 (approx.) on 2024-01-15 #stocks @market",
    "I love pizza 🍕 so much",
    "unbelievably unaffable antidisestablishmentarianism",
    "text with [SEP] inside and\ttabs\n\nand newlines",
    "x",
    " ".join(
        ["Retrieval-augmented generation pairs a language model with a search index;"]
        + ["the index holds embeddings of passages, and the nearest ones to the query"]
        + ["are added to the prompt."] * 6
    ),
]


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def main():
    model, name = Path(sys.argv[1]), sys.argv[2]
    pooling = POOLING_CODES[sys.argv[3]] if len(sys.argv) > 3 else llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED
    llm = Llama(model_path=str(model), embedding=True, n_ctx=512, n_batch=512,
                n_ubatch=512, pooling_type=pooling, verbose=False)
    records = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        embedding = llm.embed(text, normalize=False)
        records.append({"text": text, "ids": ids, "embedding": [float(x) for x in embedding]})
    golden = {
        "model_file": model.name,
        "model_sha256": sha256_of(model),
        "producer": f"llama-cpp-python {llama_cpp.__version__} Llama.embed(normalize=False)",
        "pooling": {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}[llm.pooling_type()],
        "inputs": records,
    }
    out = HERE / f"{name}.json"
    out.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({len(records)} inputs)")


if __name__ == "__main__":
    main()
