#!/usr/bin/env bash
# Builds the nomic-bert model the tests run (.ci/models.toml `nomic-bert-tiny-f16`): 2 layers,
# d=128, seeded random weights of NomicBertModel's tensor names, MiniLM's vocabulary, converted
# by llama.cpp's convert_hf_to_gguf.py. Same pinned inputs as build_embed_model.sh.
# Usage: .ci/build_nomic_model.sh OUTPUT.gguf [WORKDIR]
set -euo pipefail
EMBED_SOURCE=nomic exec bash "$(dirname "$0")/build_embed_model.sh" "$@"
