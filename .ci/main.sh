#!/usr/bin/env bash
# The main job: set up, then run the runner on the default model (SmolLM2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh
bash .ci/setup.sh

model="${WEBSHARD_MODELS:-models}/SmolLM2-135M-Instruct.Q4_1.gguf"
cargo run --release -p native-runner --bin runner -- info "$model"
cargo run --release -p native-runner --bin runner -- generate -m "$model" --chat \
  -p "What is the capital of France? Answer in one sentence." -n 48 --temp 0
