#!/usr/bin/env bash
# Builds a small test model of one architecture in GGUF, for architectures no registry package
# ships a small enough real file of: a transformers model of the real family's shape, scaled
# down, with seeded random weights and a real tokenizer taken from one of the project's GGUFs,
# converted by llama.cpp's own convert_hf_to_gguf.py. Byte for byte reproducible from pinned
# inputs:
#   - the architecture's spec:  .ci/tiny_models/ARCH.py (shape, seed, init scale, tokenizer
#                               source with its sha256, --outtype), run by make_hf.py
#   - the converter:            llama-cpp-python==0.3.36 sdist, vendor/llama.cpp (not built)
#   - its Python dependencies:  pinned below, in a throw-away virtual environment (torch from
#                               the registry is the CUDA build, ~4 GB; only its CPU is used)
#
# Usage: .ci/build_tiny_model.sh ARCH OUTPUT.gguf [WORKDIR]
# WORKDIR (default: a fresh temporary directory) keeps the downloads and the environment; one
# WORKDIR serves every build (and .ci/build_embed_model.sh's, same pins). BUILD_PYTHON, if
# set, is an interpreter that already has the pins (skips the environment). The tokenizer's
# GGUF is read from $WEBSHARD_MODELS (default: the repository's models/).
set -euo pipefail

arch=${1:?usage: build_tiny_model.sh ARCH OUTPUT.gguf [WORKDIR]}
out=${2:?usage: build_tiny_model.sh ARCH OUTPUT.gguf [WORKDIR]}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
spec=$repo/.ci/tiny_models/$arch.py
if [[ ! -f $spec ]]; then
    echo "build_tiny_model: no spec $spec (known: $(ls "$repo/.ci/tiny_models" | grep -v make_hf))" >&2
    exit 2
fi
models=${WEBSHARD_MODELS:-$repo/models}
if [[ -n ${3:-} ]]; then
    work=$3
else
    # A throw-away directory holds ~5 GB (torch): remove it however the script ends.
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

CONVERTER_PKG="llama-cpp-python==0.3.36"
CONVERTER_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PY_DEPS=(torch==2.11.0 numpy==2.2.6 transformers==4.57.6 safetensors==0.8.0
         sentencepiece==0.2.0 protobuf==4.25.8 tokenizers==0.22.2)

check_sha256() { # file expected
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [[ $got != "$2" ]]; then
        echo "build_tiny_model: $1 has sha256 $got, expected $2" >&2
        exit 1
    fi
}

# The converter, from the source distribution (only its Python files are used).
converter=$work/llama_cpp_python-0.3.36/vendor/llama.cpp
if [[ ! -f $converter/convert_hf_to_gguf.py ]]; then
    python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
        --progress-bar off -d "$work/dl-sdist" --no-binary llama-cpp-python "$CONVERTER_PKG" >&2
    sdist=$work/dl-sdist/llama_cpp_python-0.3.36.tar.gz
    check_sha256 "$sdist" "$CONVERTER_SDIST_SHA256"
    tar xzf "$sdist" -C "$work" \
        llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py \
        llama_cpp_python-0.3.36/vendor/llama.cpp/conversion \
        llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
fi

# The converter's environment.
if [[ -n ${BUILD_PYTHON:-} ]]; then
    python=$BUILD_PYTHON
else
    venv=$work/venv
    if [[ ! -x $venv/bin/python ]]; then
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --disable-pip-version-check --progress-bar off "${PY_DEPS[@]}" >&2
    python=$venv/bin/python
fi

# The transformers model (a fresh folder: its name becomes the GGUF's general.name).
hf=$work/tiny-$arch
rm -rf "$hf"
PYTHONPATH=$converter/gguf-py PYTHONHASHSEED=0 \
    "$python" "$repo/.ci/tiny_models/make_hf.py" "$spec" "$models" "$hf" >&2

mkdir -p "$(dirname "$out")"
"$python" "$converter/convert_hf_to_gguf.py" "$hf" \
    --outtype "$(cat "$hf/outtype")" --outfile "$out.partial" >&2
mv "$out.partial" "$out"
rm -rf "$hf"
sha256sum "$out"
