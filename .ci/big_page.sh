#!/usr/bin/env bash
# The > 4 GiB run in the page (docs/perf.md, "Big models, session 11"; not CI: ~15 GB of disk
# and many minutes of SwiftShader): e2e/tests/big-file.spec.js on a 4.9 GB model, one file and
# its 3 gguf-split parts, each streamed into WebGPU buffers of headless Chromium in bounded wasm
# memory, its ids compared with `runner generate` on the same file. The spec writes the files
# into a temporary folder and deletes them at the end.
#
#   .ci/big_page.sh [MODEL ARGS...]     (default: 4700 --hidden 12288 --ffn 256 --heads 96
#                                        --kv-heads 8 --embedding F32)
# WEBSHARD_BIG_MINUTES (default 120) limits each of the spec's steps.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh
export WEBSHARD_MODELS=${WEBSHARD_MODELS:-$PWD/models}
export WEBSHARD_BIG_ARGS=${*:-4700 --hidden 12288 --ffn 256 --heads 96 --kv-heads 8 --embedding F32}
export WEBSHARD_BIG_SPLIT_ARGS=$WEBSHARD_BIG_ARGS
export WEBSHARD_BIG_MINUTES=${WEBSHARD_BIG_MINUTES:-120}
# The runner and the example together, with the features `cargo test --workspace` unifies
# (a build of one package alone would rebuild the dependencies with others).
cargo build --release --workspace --bins --examples
bash .ci/build-wasm.sh
cd e2e && npx --no-install playwright test big-file.spec.js
