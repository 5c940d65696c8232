#!/usr/bin/env bash
# On the device machine (from the repository root there). Subcommands:
#   setup            unpack the carried Vulkan loader (.gl/*.deb) and point at NVIDIA's ICD
#   stash            keep every carried .device/parts/NAME.partNN (or .device/pNN/NAME.partNN, one
#                    folder a call) under /root/parts (any order)
#   assemble         join each model's parts in order into /root/models/NAME, check sha256
#   synth            for speed runs: each model as its real first MiBs (the whole GGUF header)
#                    followed by random bytes up to its real size, every byte below 0x40 so
#                    every f16/bf16/f32 field stays finite (same work per token as the real file)
#   bench [ARGS]     runner bench on every verified model, JSON into $OUT/bench-*.json
#   tiles TILE... [-- ARGS]
#                    runner bench --matmul-tile TILE (ROWS,TOKENS,STAGED_COLS) for each tile on
#                    every model: a line per run, every JSON
#                    into $OUT/tiles.jsonl (default ARGS: -p 512 -n 16 -r 3)
#   batch-splits SPLIT... [-- ARGS]
#                    the same with --matvec-batch-split SPLIT (LANES,LANES_PER_ROW,ROWS_PER_LANE,
#                    TOKENS), into $OUT/batch-splits.jsonl (default ARGS: -p 0 -n 64 -r 2
#                    --batch-rows 1,4,16)
#   ab [ARGS]        an A/B of runner builds: each carried .device/ab/runner-NAME.xz (pack them
#                    with `xz -T0`; unpacked to /root/ab/runner-NAME, which later calls on a warm
#                    machine can name in RUNNER), ROUNDS rounds (default 2) of runner bench on every model,
#                    interleaved; a line per run, JSON into $OUT/ab.jsonl (default ARGS: -p 0
#                    -n 128 -r 2 --batch-rows 1,4,16)
#   spec [ARGS]      speculative decoding (needs the real weights: assemble first): runner
#                    bench --prompt-file P --spec lookup on every .ci/spec_prompts/*.txt and
#                    model, plain and speculative in one process; a line per run, JSON into
#                    $OUT/spec-PROMPT-MODEL.json (default ARGS: -n 256 -r 3 --draft-max 15)
#   same-ids FLAG... greedy ids (runner generate --temp 0, 48 tokens after a ~300-token prompt)
#                    on every model with and without runner flags FLAG... (a knob that turns a
#                    kernel change off, e.g. --coop-k-splits 1): a line per model, same or not
#   score MODEL IDS  teacher-forced top-5 (fidelity spot check), JSON into $OUT
#   llama-build      build llama.cpp with CUDA (llama-bench, llama-server) from the carried
#                    source tarball .device/llama.tgz (pack.sh LLAMA_SRC=...) into /root/llama,
#                    in its own process session on cores 2.. so that it survives between calls
#                    and leaves cores 0-1 to a benchmark; log in /root/llama/build.log
#                    (LLAMA_TARGETS: fewer targets, e.g. llama-bench alone, ~2 min less)
#                    LLAMA_BACKEND=vulkan: llama.cpp's Vulkan backend instead, into build-vk,
#                    with Debian 13's glslc, Vulkan headers and SPIRV-Headers carried as
#                    .device/vk/*.deb (pack.sh VULKAN_TOOLS=1: Debian 12's glslc lacks the
#                    cooperative-matrix and integer-dot extensions llama.cpp's fast paths need);
#                    glslc runs through Debian 13's own loader and libraries
#   llama-wait       wait for that build (at most 540 s), then say whether both targets exist
#   llama-bench [ARGS]
#                    llama-bench -ngl 99 beside runner bench on every model, one after the
#                    other, a ratio table at the end (default ARGS: -p 512 -n 128 -r 5);
#                    LLAMA_BACKEND=vulkan: the Vulkan build's, JSON into $OUT/vulkan
#   serve-bench [ARGS]
#                    runner serve -m and llama-server (where built) on every model, one after the other,
#                    each driven by .ci/bench_serve.py (ARGS for it; default --streams
#                    1,4,16,64 --max-tokens 128; SERVE_ARGS: more flags for runner serve);
#                    JSON lines into $OUT/serve.jsonl and a ratio table at the end
#   serve-spec [ARGS]
#                    speculative decoding through the HTTP API (real weights: assemble first):
#                    runner serve -m on every model, one stream per .ci/spec_prompts/*.txt
#                    plain and with webshard_spec (bench_serve.py --spec 15); JSON lines into
#                    $OUT/serve-spec.jsonl (default ARGS: --max-tokens 256)
#   fidelity         the fidelity test (llama.cpp goldens, teacher-forced and greedy) on the
#                    assembled real models, output into $OUT/fidelity.txt
set -uo pipefail
models=${DEVICE_MODELS:-/root/models}  # DEVICE_MODELS: another folder of models
runner=${RUNNER:-.device/bin/runner}     # RUNNER: another runner binary (an A/B of two builds)
mkdir -p "$models"
vulkan_env() {
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export XDG_RUNTIME_DIR=/tmp/xdg && mkdir -p -m 700 "$XDG_RUNTIME_DIR"
}
# llama.cpp's build folder for LLAMA_BACKEND (cuda, the default, or vulkan).
llama_build_dir() {
  case "${LLAMA_BACKEND:-cuda}" in
    vulkan) echo build-vk ;;
    *) echo build ;;
  esac
}
# Debian 13's glslc, Vulkan headers and SPIRV-Headers unpacked under /root/vk, and a glslc
# wrapper that runs it through Debian 13's loader and libraries (it needs glibc 2.38).
vulkan_tools() {
  mkdir -p /root/vk
  for f in .device/vk/*.deb; do dpkg -x "$f" /root/vk; done
  cat > /root/vk/glslc <<'WRAPPER'
#!/bin/sh
lib=/root/vk/usr/lib/x86_64-linux-gnu
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" /root/vk/usr/bin/glslc "$@"
WRAPPER
  chmod +x /root/vk/glslc
}
# Reads one `runner bench --json` run from stdin, adds the KEY=VALUE labels given after the
# file, appends it to file $1 as a JSON line and prints the labels and each test's tok/s.
record_run() {
  python3 -c 'import json, sys
run = json.loads(sys.stdin.read())
labels = dict(arg.split("=", 1) for arg in sys.argv[2:])
run.update(labels)
open(sys.argv[1], "a").write(json.dumps(run) + "\n")
print(" ".join(v[:24] for v in labels.values()),
      " ".join("%s %.0f±%.0f" % (t["test"], t["tok_s"], t["sd"]) for t in run["tests"]))' "$@"
}
# Waits for the server (pid $1) on port $4 to be healthy, drives it with bench_serve.py as
# label $2 and model $3 (the rest: its arguments), then stops it.
serve_and_bench() {
  local pid=$1 label=$2 name=$3 port=$4
  shift 4
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 1
  done
  python3 .ci/bench_serve.py --url "http://127.0.0.1:$port" --model "$name" --label "$label" \
    --json "$OUT/serve.jsonl" "$@" || echo "$label on $name: bench failed"
  kill "$pid"
  wait "$pid" 2> /dev/null
}
case "${1:-}" in
  setup)
    for f in .gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
    ;;
  stash)
    mkdir -p /root/parts
    cp -v .device/parts/*.part[0-9][0-9] .device/p[0-9][0-9]/*.part[0-9][0-9] /root/parts/ 2>/dev/null
    ls /root/parts | wc -l
    ;;
  assemble)
    for first in /root/parts/*.part00; do
      name=$(basename "$first" .part00)
      cat /root/parts/"$name".part[0-9][0-9] > "$models/$name"
    done
    python3 - "$models" <<'PY'
import hashlib, os, re, sys
models = sys.argv[1]
text = open(".device/bin/models.toml").read()
for file, sha in re.findall(r'file = "([^"]+)"\s*\nbytes = \d+\s*\nsha256 = "([0-9a-f]+)"', text):
    path = os.path.join(models, file)
    if not os.path.exists(path):
        print(f"missing {file}")
        continue
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if h != sha:
        os.remove(path)
    print(("ok " if h == sha else "MISMATCH (removed) ") + file)
PY
    ;;
  synth)
    python3 - "$models" <<'PY'
import os, random, re, sys
models = sys.argv[1]
text = open(".device/bin/models.toml").read()
for file, size in re.findall(r'file = "([^"]+)"\s*\nbytes = (\d+)', text):
    head_path = f".device/bin/{file}.head"
    if not os.path.exists(head_path):
        continue
    head = open(head_path, "rb").read()
    rng = random.Random(file)
    table = bytes(range(0x40)) * 4
    with open(os.path.join(models, file), "wb") as out:
        out.write(head)
        left = int(size) - len(head)
        while left > 0:
            n = min(left, 1 << 24)
            out.write(rng.randbytes(n).translate(table))
            left -= n
    print(f"synthetic {file}: {size} bytes, real header")
PY
    ;;
  bench)
    shift
    vulkan_env
    for model in "$models"/*.gguf; do
      name=$(basename "$model" .gguf)
      "$runner" bench -m "$model" --quiet --json "$@" | tee "$OUT/bench-$name.json"
    done
    ;;
  tiles | batch-splits)
    # One flag's values in turn on every model.
    mode=$1
    shift
    vulkan_env
    flag=--matmul-tile
    defaults=(-p 512 -n 16 -r 3)
    if [ "$mode" = batch-splits ]; then
      flag=--matvec-batch-split
      defaults=(-p 0 -n 64 -r 2 --batch-rows 1,4,16)
    fi
    values=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do values+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    [ $# -gt 0 ] || set -- "${defaults[@]}"
    for value in "${values[@]}"; do
      for model in "$models"/*.gguf; do
        "$runner" bench -m "$model" --quiet --json "$flag" "$value" "$@" \
          | record_run "$OUT/$mode.jsonl" flag="$flag" value="$value" model_file="$(basename "$model")"
      done
    done
    ;;
  ab)
    shift
    vulkan_env
    [ $# -gt 0 ] || set -- -p 0 -n 128 -r 2 --batch-rows 1,4,16
    # Unpacked outside the working tree: a later call that carries .device/ab again replaces
    # that folder, and RUNNER=/root/ab/runner-NAME must still find its binary then.
    rm -rf /root/ab && mkdir -p /root/ab
    for packed in .device/ab/runner-*.xz; do
      unpacked=/root/ab/$(basename "${packed%.xz}")
      xz -dc "$packed" > "$unpacked" && chmod +x "$unpacked"
    done
    for round in $(seq "${ROUNDS:-2}"); do
      for build in /root/ab/runner-*; do
        for model in "$models"/*.gguf; do
          "$build" bench -m "$model" --quiet --json "$@" | record_run "$OUT/ab.jsonl" \
            round="$round" build="${build#/root/ab/runner-}" model_file="$(basename "$model")"
        done
      done
    done
    ;;
  spec)
    shift
    vulkan_env
    [ $# -gt 0 ] || set -- -n 256 -r 3 --draft-max 15
    for prompt in .ci/spec_prompts/*.txt; do
      for model in "$models"/*.gguf; do
        out="$OUT/spec-$(basename "$prompt" .txt)-$(basename "$model" .gguf).json"
        "$runner" bench -m "$model" --quiet --json -p 0 --prompt-file "$prompt" \
          --spec lookup "$@" > "$out"
        python3 -c 'import json, sys
run = json.load(open(sys.argv[1])); s = run["spec"]
mean = lambda v: sum(v) / len(v)
print("%-12s %-28s plain %7.1f tok/s  spec %7.1f tok/s  %.2fx  accepted %d/%d (%.0f%%)  %d tokens  ids %s" % (
    sys.argv[2], sys.argv[3][:28], mean(s["plain_tok_s"]), mean(s["spec_tok_s"]),
    mean(s["spec_tok_s"]) / mean(s["plain_tok_s"]), s["accepted"], s["drafted"],
    100 * s["acceptance"], s["tokens"], "identical" if s["identical"] else "DIFFER"))
runs = len(s["spec_tok_s"]); steps = max(s["verifications"], 1)
print("%-41s a run: %.1f ms, %.1f verification steps of %.2f ms, %.1f decoder starts" % (
    "", 1e3 * s["spec_seconds"] / runs, s["verifications"] / runs,
    1e3 * s["verify_seconds"] / steps, s["decoder_starts"] / runs))' \
          "$out" "$(basename "$prompt" .txt)" "$(basename "$model")"
      done
    done
    ;;
  fidelity)
    vulkan_env
    WEBSHARD_MODELS="$models" WEBSHARD_GOLDENS=.device/fidelity/goldens \
      WEBSHARD_TEST_BACKENDS=vulkan .device/fidelity/fidelity fidelity:: --nocapture --test-threads 1 2>&1 \
      | tee "$OUT/fidelity.txt"
    ;;
  same-ids)
    shift
    vulkan_env
    prompt=$(python3 -c 'print(" ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 22))')
    for model in "$models"/*.gguf; do
      "$runner" generate -m "$model" -p "$prompt" -n 48 --temp 0 --json --quiet > /tmp/ids-plain.json
      "$runner" generate -m "$model" -p "$prompt" -n 48 --temp 0 --json --quiet "$@" > /tmp/ids-flag.json
      python3 -c 'import json, sys
a, b = (json.load(open(f"/tmp/ids-{k}.json")) for k in ("plain", "flag"))
same = "same ids" if a["ids"] == b["ids"] else "DIFFERENT ids"
print(sys.argv[1], len(a["prompt_ids"]), "prompt tokens:", same, a["ids"][:8], b["ids"][:8])' \
        "$(basename "$model")"
    done
    ;;
  score)
    vulkan_env
    "$runner" score -m "$models/$2" --ids "$3" --top 5 --json --quiet > "$OUT/score-$2.json"
    ;;
  llama-build)
    mkdir -p /root/llama
    [ -f /root/llama/CMakeLists.txt ] || tar xzf .device/llama.tgz -C /root/llama
    build=$(llama_build_dir)
    backend_flags="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
    if [ "$build" = build-vk ]; then
      vulkan_tools
      backend_flags="-DGGML_VULKAN=ON -DCMAKE_PREFIX_PATH=/root/vk/usr \
        -DVulkan_INCLUDE_DIR=/root/vk/usr/include -DVulkan_GLSLC_EXECUTABLE=/root/vk/glslc \
        -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1"
    fi
    cd /root/llama
    BUILD=$build BACKEND_FLAGS=$backend_flags TARGETS=${LLAMA_TARGETS:-llama-bench llama-server} \
      setsid nohup taskset -c 2-"$(($(nproc) - 1))" bash -c '
      cmake -B "$BUILD" -G Ninja $BACKEND_FLAGS -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF \
        && cmake --build "$BUILD" --target $TARGETS; echo "build exit $?"' \
      > "/root/llama/$build.log" 2>&1 < /dev/null &
    echo "llama.cpp build started (log /root/llama/$build.log)"
    ;;
  llama-wait)
    build=$(llama_build_dir)
    for _ in $(seq 540); do
      grep -q "^build exit" "/root/llama/$build.log" 2>/dev/null && break
      sleep 1
    done
    tail -3 "/root/llama/$build.log"
    ls -la "/root/llama/$build/bin/llama-bench" "/root/llama/$build/bin/llama-server"
    ;;
  llama-bench)
    shift
    vulkan_env
    [ $# -gt 0 ] || set -- -p 512 -n 128 -r 5
    build=$(llama_build_dir)
    out=$OUT
    [ "$build" = build-vk ] && out=$OUT/vulkan && mkdir -p "$out"
    for model in "$models"/*.gguf; do
      name=$(basename "$model" .gguf)
      "/root/llama/$build/bin/llama-bench" -m "$model" -ngl 99 -o json "$@" > "$out/llama-bench-$name.json"
      "$runner" bench -m "$model" --quiet --json "$@" > "$out/bench-$name.json"
    done
    python3 .ci/device/ratios.py bench "$out"
    ;;
  serve-bench)
    shift
    vulkan_env
    [ $# -gt 0 ] || set -- --streams 1,4,16,64 --max-tokens 128
    port=18080
    for model in "$models"/*.gguf; do
      name=$(basename "$model" .gguf)
      # shellcheck disable=SC2086  # SERVE_ARGS: extra flags for runner serve, word-split
      "$runner" serve -m "$model" --alias "$name" --port "$port" --parallel 64 \
        --queue 256 --ctx 512 ${SERVE_ARGS:-} > "$OUT/serve-$name.log" 2>&1 &
      serve_and_bench "$!" webshard "$name" "$port" "$@"
      # Without llama-server (a build of llama-bench alone), ours alone: no health wait.
      [ -x /root/llama/build/bin/llama-server ] || continue
      /root/llama/build/bin/llama-server -m "$model" --alias "$name" --port "$port" -ngl 99 \
        -np 64 -c 32768 > "$OUT/llama-server-$name.log" 2>&1 &
      serve_and_bench "$!" llama-server "$name" "$port" "$@"
    done
    python3 .ci/device/ratios.py serve "$OUT"
    ;;
  serve-spec)
    shift
    vulkan_env
    [ $# -gt 0 ] || set -- --max-tokens 256
    port=18081
    for model in "$models"/*.gguf; do
      name=$(basename "$model" .gguf)
      "$runner" serve -m "$model" --alias "$name" --port "$port" --ctx 4096 \
        > "$OUT/serve-spec-$name.log" 2>&1 &
      pid=$!
      for _ in $(seq 120); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
        sleep 1
      done
      for prompt in .ci/spec_prompts/*.txt; do
        for spec in "" "--spec 15"; do
          # shellcheck disable=SC2086  # $spec: no flag, or the flag and its value
          python3 .ci/bench_serve.py --url "http://127.0.0.1:$port" --model "$name" \
            --streams 1 --prompt-file "$prompt" $spec --json "$OUT/serve-spec.jsonl" \
            --label "$(basename "$prompt" .txt)${spec:+ spec}" "$@" | tail -1
        done
      done
      kill "$pid"
      wait "$pid" 2> /dev/null
    done
    ;;
  *) echo "usage: run.sh setup|stash|assemble|synth|bench|tiles|spec|llama-build|llama-wait|llama-bench|serve-bench|serve-spec|fidelity|score"; exit 2 ;;
esac
