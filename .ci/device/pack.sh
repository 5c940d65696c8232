#!/usr/bin/env bash
# Here, before using the device tool: build the release runner, strip it, and split the real
# models into parts small enough to travel (the device tool carries at most 64 MiB per call).
# Writes everything under .device/ (git-ignored). Then make the calls that `.ci/device/README.md`
# lists, each carrying .gl, .device/bin (first call only) and one part.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
part_mib=${PART_MIB:-58}
cargo build --release -p native-runner --bin runner
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p .device/bin .device/parts
strip -o .device/bin/runner "$target_dir/release/runner"
cp .ci/models.toml .device/bin/models.toml
for model in "${WEBSHARD_MODELS:-models}"/*.gguf; do
  name=$(basename "$model")
  if ! ls .device/parts/"$name".part* >/dev/null 2>&1; then
    split -b "${part_mib}M" -d -a 2 "$model" ".device/parts/$name.part"
  fi
done
ls -1 .device/parts
