#!/usr/bin/env bash
# Here, before using the device tool: build the release runner, strip it, keep the first
# HEAD_MIB of each model (its whole GGUF header) for speed runs on synthetic weights, and split
# the real models into parts small enough to travel (the device tool carries at most 64 MiB per
# call). Writes everything under .device/ (git-ignored).
#
# Speed, in one device call (carry .gl and .device/bin; .device/bin must stay under 64 MiB, so
# keep only the heads of the models to run):
#   bash .ci/device/run.sh setup && bash .ci/device/run.sh synth && bash .ci/device/run.sh bench
# Real weights (fidelity), one call per part, carrying .device/parts/<one part> each time:
#   bash .ci/device/run.sh stash   ...then, carrying .device/fidelity,
#   bash .ci/device/run.sh assemble && bash .ci/device/run.sh fidelity
# Beside llama.cpp CUDA (LLAMA_SRC=a llama.cpp checkout; carry .device/llama.tgz too):
#   run.sh setup && run.sh synth && run.sh llama-build, then run.sh llama-wait and
#   run.sh llama-bench / run.sh serve-bench
# Beside llama.cpp Vulkan (VULKAN_TOOLS=1 too; carry .device/vk as well): the same with
#   LLAMA_BACKEND=vulkan before llama-build, llama-wait and llama-bench
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
part_mib=${PART_MIB:-58}
cargo build --release -p native-runner --bin runner
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p .device/bin .device/parts
strip -o .device/bin/runner "$target_dir/release/runner"
cp .ci/models.toml .device/bin/models.toml
# The fidelity tests against llama.cpp's goldens (module `fidelity` of the test suite), to run on
# the real weights there.
if [ "${FIDELITY:-1}" = 1 ]; then
  test_bin=$(cargo test --release -p webshard --test suite --no-run --message-format json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "suite" and m.get("executable"):
        print(m["executable"])')
  mkdir -p .device/fidelity/goldens
  strip -o .device/fidelity/fidelity "$test_bin"
  cp "${WEBSHARD_GOLDENS:-../shared/goldens}"/*.generate.json .device/fidelity/goldens/
fi
# llama.cpp's source for the same-run peers (run.sh llama-build), from a git checkout of it
# (the unslothai/llama.cpp mirror): only what the CUDA build of llama-bench and llama-server
# reads, about 9 MB.
if [ -n "${LLAMA_SRC:-}" ]; then
  git -C "$LLAMA_SRC" archive --format=tar HEAD CMakeLists.txt cmake common ggml include src \
    tools vendor scripts licenses LICENSE examples app | gzip -9 > .device/llama.tgz
fi
# Debian 13's glslc (with the libraries it needs), Vulkan headers and SPIRV-Headers, for
# llama.cpp's Vulkan backend built on the device (run.sh LLAMA_BACKEND=vulkan llama-build):
# Debian 12's glslc (glslang 11) lacks the cooperative-matrix and integer-dot extensions that
# llama.cpp's fast Vulkan paths compile with. About 8 MB; fetched once.
if [ "${VULKAN_TOOLS:-0}" = 1 ] && ! ls .device/vk/glslc_*.deb > /dev/null 2>&1; then
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" .device/vk
  echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
  apt_options=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=-
    -o "Dir::State::Lists=$apt_dir/lists")
  apt-get "${apt_options[@]}" update
  (cd .device/vk && apt-get "${apt_options[@]}" download glslc libshaderc1 libc6 libstdc++6 \
    libgcc-s1 libvulkan-dev spirv-headers)
  rm -rf "$apt_dir"
fi
head_mib=${HEAD_MIB:-8}
for model in "${WEBSHARD_MODELS:-models}"/*.gguf; do
  head -c "$((head_mib * 1024 * 1024))" "$model" > ".device/bin/$(basename "$model").head"
done
for model in "${WEBSHARD_MODELS:-models}"/*.gguf; do
  name=$(basename "$model")
  if ! ls .device/parts/"$name".part* >/dev/null 2>&1; then
    split -b "${part_mib}M" -d -a 2 "$model" ".device/parts/$name.part"
  fi
done
ls -1 .device/parts
