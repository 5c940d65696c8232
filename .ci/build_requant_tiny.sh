#!/usr/bin/env bash
# Builds tiny-llama3-mixq: tiny-llama3-f16's ffn_gate and ffn_up matrices rewritten into Q2_K (blk.0), Q3_K
# (blk.1), IQ4_NL (blk.2) and IQ4_XS (blk.3) by .ci/requantize_tiny.py (numpy only; simple valid
# encodings: the goldens come from llama.cpp running this very file). Byte for byte
# reproducible: the input is pinned by its own sha256 in .ci/models.toml, numpy below.
#
# Usage: .ci/build_requant_tiny.sh OUTPUT.gguf [WORKDIR]
# Reads tiny-llama3.F16.gguf from $WEBSHARD_MODELS (default: the repository's models/). WORKDIR
# (default: a fresh temporary directory) keeps the environment; build_tiny_model.sh's one
# (WORKDIR/venv, same numpy pin) is used where it exists.
set -euo pipefail

out=${1:?usage: build_requant_tiny.sh OUTPUT.gguf [WORKDIR]}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
models=${WEBSHARD_MODELS:-$repo/models}
if [[ -n ${2:-} ]]; then
    work=$2
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

NUMPY="numpy==2.2.6"
python=$work/venv/bin/python
if [[ ! -x $python ]]; then
    venv=$work/numpy-venv
    if [[ ! -x $venv/bin/python ]]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --disable-pip-version-check --progress-bar off "$NUMPY" >&2
    fi
    python=$venv/bin/python
fi
"$python" -c 'import numpy; assert numpy.__version__ == "2.2.6", numpy.__version__'

input=$models/tiny-llama3.F16.gguf
if [[ ! -f $input ]]; then
    echo "build_requant_tiny: $input is missing (models.toml's tiny-llama3-f16 builds it)" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
"$python" "$repo/.ci/requantize_tiny.py" "$input" "$out.partial"
mv "$out.partial" "$out"
sha256sum "$out"
