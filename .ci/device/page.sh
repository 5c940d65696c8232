#!/usr/bin/env bash
# The chat page in headless Chromium on the device (issue 14): WebGPU through Dawn on the
# machine's GPU (Vulkan), beside the native runner on the same model in the same call.
# Here first: `bash .ci/device/page-pack.sh` (writes .device/page/c1, .device/page/c2,
# .device/bin and .gl). On the device machine, from the repository root:
#
#   bash .ci/device/page.sh go      every call, the same command. It keeps what this call
#                                   carried (.device/page/cN/*) under /root/page (the machine
#                                   stays warm ~30 s between calls), prepares what it can, and
#                                   once every piece is there: unpacks Chromium (+ its libraries)
#                                   under /root/cr, makes the synthetic SmolLM2 twin, starts
#                                   `runner serve`, times native decode, probes which Chromium
#                                   flags give WebGPU the NVIDIA adapter, runs the page's
#                                   autorun with them and times it again warm, then native again.
#
# Call 1 carries .gl .device/bin .device/page/c1; call 2 carries .device/page/c2 and .device/page/c3
# (two DejaVu fonts: without fonts Chromium's renderer dies), back to back.
# Output: $OUT/go.log (tee it), $OUT/summary.json, $OUT/page-logs.tar.gz.
# PAGE_N (128): tokens per generation; PAGE_WARM (10): warm page runs; PAGE_RELOADS (2): autoruns
# again from a fresh navigation in the same browser; PROBES: flag sets to try
# (one per line; default below). For a trial elsewhere: STAGE, CR_DIR, DEVICE_MODELS, OUT,
# SKIP_SETUP=1, NATIVE_P/NATIVE_R (512/5), ALLOW_FALLBACK=1 (run the page on SwiftShader).
set -uo pipefail
set -x
repo=$(pwd)
stage=${STAGE:-/root/page}
cr_dir=${CR_DIR:-/root/cr}
models=${DEVICE_MODELS:-/root/models}
model_file=SmolLM2-135M-Instruct.Q4_1.gguf
out=${OUT:-/tmp/out}
logs=$stage/logs
mkdir -p "$stage" "$models" "$out" "$logs"
n=${PAGE_N:-128}
warm=${PAGE_WARM:-10}
reloads=${PAGE_RELOADS:-2}
prompt="The capital of France is"
native_p=${NATIVE_P:-512}
native_r=${NATIVE_R:-5}
t0=$(date +%s)
step() { set +x; echo "=== [$(( $(date +%s) - t0 )) s] $*"; set -x; }

vulkan_env() {
  [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] || return 0
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export VK_ICD_FILENAMES=$VK_DRIVER_FILES
  export XDG_RUNTIME_DIR=/tmp/xdg && mkdir -p -m 700 "$XDG_RUNTIME_DIR"
}

finish() {
  step "collect"
  cp -f "$stage"/*.json "$stage"/*.jsonl "$stage"/*.txt "$logs"/ 2>/dev/null
  tar -czf "$out/page-logs.tar.gz" -C "$stage" logs 2>/dev/null
  [ -f "$stage/summary.json" ] && cp "$stage/summary.json" "$out/summary.json"
  step "done"
}
trap finish EXIT

step "stage what this call carried"
for dir in .device/page/c1 .device/page/c2 .device/page/c3; do
  [ -d "$dir" ] && cp -v "$dir"/* "$stage"/
done
ls -la "$stage"

step "machine"
{
  uname -a
  ldd --version | head -1
  nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ls /usr/local/nvidia/share/vulkan/icd.d/ 2>&1
  ldconfig -p | grep -E 'libvulkan|libGLX_nvidia|libnss3|libglib-2|libX11|libgbm|libfontconfig|libdbus' 2>&1
  python3 --version
  df -h /root | tail -1
} 2>&1 | tee "$stage/machine.txt"

if [ ! -f "$stage/prepared" ]; then
  step "prepare: Vulkan loader, runner, synthetic model, wasm package"
  if [ -d .gl ] && [ -z "${SKIP_SETUP:-}" ]; then bash .ci/device/run.sh setup; fi
  [ -f "$stage/runner.xz" ] && xz -dc "$stage/runner.xz" > "$stage/runner" && chmod +x "$stage/runner"
  if [ -f .device/bin/models.toml ]; then
    DEVICE_MODELS="$models" bash .ci/device/run.sh synth
  fi
  if [ -x "$stage/runner" ] && [ -f "$models/$model_file" ] && [ -f "$stage/pkg.tar.xz" ]; then
    touch "$stage/prepared"
    (vulkan_env; timeout 60 "$stage/runner" bench -m "$models/$model_file" --quiet --json -p 0 -n 16 -r 1 \
      | tee "$stage/native-sanity.json")
  fi
fi
tar -xJf "$stage/pkg.tar.xz" -C "$repo" 2>/dev/null
ls -la "$repo/pkg" "$models" 2>&1

parts=$(ls "$stage"/chromium.tar.xz.part* 2>/dev/null | wc -l)
want=$(cat "$stage/chromium.parts" 2>/dev/null || echo 2)
if [ ! -f "$stage/prepared" ] || [ "$parts" -lt "$want" ]; then
  step "NOT READY: prepared=$([ -f "$stage/prepared" ] && echo yes || echo no), chromium parts $parts of $want"
  exit 3
fi

if [ ! -x $cr_dir/chromium/chromium-headless-shell ]; then
  step "unpack Chromium"
  mkdir -p "$cr_dir"
  cat "$stage"/chromium.tar.xz.part* | xz -dc | tar -xf - -C "$cr_dir" || { step "unpack FAILED"; exit 4; }
  (cd "$stage" && sha256sum -c chromium.sha256 2>&1 | tail -1)
fi
chrome=$cr_dir/chromium/chromium-headless-shell
libdir=$cr_dir/chromium/lib
# Debian 12's libstdc++ and libexpat want glibc 2.36: on an older glibc use the system's.
glibc=$(ldd --version | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
if [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | head -1)" != 2.36 ]; then
  rm -f "$libdir/libstdc++.so.6" "$libdir/libexpat.so.1"
fi
LD_LIBRARY_PATH=$libdir ldd "$chrome" | grep -i 'not found' | tee "$stage/missing-libs.txt"
export CHROME_LD_PATH=$libdir
# Without a fontconfig config Skia's renderer dies (FATAL SkFontMgr_FontConfigInterface.cpp:163
# "Not implemented"): a minimal fonts.conf over carried DejaVu fonts.
if ls "$stage"/*.ttf > /dev/null 2>&1; then
  mkdir -p "$cr_dir/fonts" && cp "$stage"/*.ttf "$cr_dir/fonts/"
  cat > "$cr_dir/fonts.conf" <<EOF
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>$cr_dir/fonts</dir><cachedir>/tmp/fontconfig-cache</cachedir></fontconfig>
EOF
  export FONTCONFIG_FILE=$cr_dir/fonts.conf
fi
LD_LIBRARY_PATH=$libdir "$chrome" --version | tee "$stage/chromium-version.txt"

vulkan_env
model="$models/$model_file"
runner="$stage/runner"
"$runner" --version 2>&1 | head -1 | tee "$stage/runner-version.txt"

step "native 1: runner bench (default kernels)"
timeout 120 "$runner" bench -m "$model" --quiet --json -p "$native_p" -n "$n" -r "$native_r" > "$stage/native-bench.json" 2> "$logs/native-bench.err"
cat "$stage/native-bench.json"
step "native 2: runner bench --no-subgroups (the kernels a browser gets)"
timeout 120 "$runner" bench -m "$model" --quiet --json -p "$native_p" -n "$n" -r "$native_r" --no-subgroups > "$stage/native-bench-nosub.json" 2> "$logs/native-bench-nosub.err"
cat "$stage/native-bench-nosub.json"
step "native 2b: runner bench --no-f16 --no-subgroups (f32+workgroup, the variant of a browser without shader-f16)"
timeout 120 "$runner" bench -m "$model" --quiet --json -p "$native_p" -n "$n" -r "$native_r" --no-f16 --no-subgroups > "$stage/native-bench-f32.json" 2> "$logs/native-bench-f32.err"
cat "$stage/native-bench-f32.json"
step "native 3: runner generate, the page's autorun request (cold process)"
timeout 120 "$runner" generate -m "$model" -p "$prompt" -n "$n" --temp 0 --json --quiet > "$stage/native-generate.json" 2> "$stage/native-generate.txt"
cat "$stage/native-generate.txt"

step "runner serve"
"$runner" serve --root "$repo" --models "$models" --host 127.0.0.1 --port 8765 > "$logs/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 60); do curl -sf -o /dev/null http://127.0.0.1:8765/ && break; sleep 0.5; done
curl -s -o /dev/null -w 'index %{http_code}\n' http://127.0.0.1:8765/
curl -s -o /dev/null -w 'model %{http_code} %{size_download}\n' -r 0-1023 "http://127.0.0.1:8765/models/$model_file"

step "probe Chromium flag sets for the WebGPU adapter"
common="--disable-dev-shm-usage"
default_probes="--enable-unsafe-webgpu
--enable-unsafe-webgpu --enable-features=Vulkan
--enable-unsafe-webgpu --enable-features=Vulkan --use-angle=vulkan --disable-vulkan-surface
--enable-unsafe-webgpu --enable-features=Vulkan --use-angle=vulkan --use-vulkan=native --disable-vulkan-surface --ignore-gpu-blocklist --disable-gpu-sandbox
--enable-unsafe-webgpu --ignore-gpu-blocklist --use-angle=vulkan
--enable-unsafe-webgpu --enable-features=Vulkan --use-angle=vulkan
--enable-unsafe-webgpu --enable-features=Vulkan --use-angle=vulkan --disable-vulkan-surface --enable-webgpu-developer-features
--enable-unsafe-webgpu --enable-features=Vulkan --use-angle=vulkan --disable-vulkan-surface --enable-webgpu-developer-features --enable-dawn-features=allow_unsafe_apis"
: > "$stage/probes.jsonl"
chosen=""
i=0
mapfile -t probes <<< "${PROBES:-$default_probes}"
for flags in "${probes[@]}"; do
  [ -n "$flags" ] || continue
  i=$((i + 1))
  VK_LOADER_DEBUG=error,warn,driver timeout 60 python3 .ci/device/cdp.py probe --chrome "$chrome" --flags "$common $flags" \
    --label "probe$i" --logs "$logs" --port $((9300 + i)) --timeout 30 >> "$stage/probes.jsonl" < /dev/null
  tail -1 "$stage/probes.jsonl" | python3 -c 'import json, sys
d = json.loads(sys.stdin.read()); a = (d.get("adapter") or {}).get("high-performance") or {}
print("probe", sys.argv[1], "|", d.get("flags"), "|", a.get("vendor"), a.get("architecture"), a.get("description"),
      "fallback" if a.get("is_fallback") else "", "f16" if "shader-f16" in a.get("features", []) else "no-f16",
      "subgroups" if "subgroups" in a.get("features", []) else "no-subgroups", d.get("error", ""),
      "| webgpu:", ((d.get("gpu") or {}).get("feature_status") or {}).get("webgpu"))' "$i"
  if [ -z "$chosen" ] && tail -1 "$stage/probes.jsonl" | python3 -c 'import json, os, sys
a = ((json.loads(sys.stdin.read()).get("adapter") or {}).get("high-performance") or {})
ok = a and (os.environ.get("ALLOW_FALLBACK") or (not a.get("is_fallback") and a.get("architecture") != "swiftshader"))
sys.exit(0 if ok else 1)'; then
    chosen="$flags"
  fi
done
echo "${chosen:-none}" > "$stage/chosen.txt"
echo "chosen flags: ${chosen:-none}"

if [ -n "$chosen" ]; then
  step "the page: autorun (n=$n, cold) then $warm warm generations, flags: $chosen"
  timeout 300 python3 .ci/device/cdp.py page --chrome "$chrome" --flags "$common $chosen" \
    --label page --logs "$logs" --port 9400 --n "$n" --warm "$warm" --reloads "$reloads" \
    --timeout 120 > "$stage/page.json" < /dev/null
  cat "$stage/page.json"
  # The same page without subgroup operations (the URL's subgroups=0): an A/B of the kernels
  # the browser picks, in the same browser flags and call.
  step "the page again without subgroups (subgroups=0)"
  timeout 200 python3 .ci/device/cdp.py page --chrome "$chrome" --flags "$common $chosen" \
    --label page-nosub --logs "$logs" --port 9402 --n "$n" --warm "$warm" --timeout 120 \
    --query subgroups=0 > "$stage/page-nosub.json" < /dev/null
  cat "$stage/page-nosub.json"
  # Two decode steps in flight instead of the page's four (the URL's depth=2, native's
  # default): what the deeper pipeline gives the page (session 35: 0.60x -> 0.89x native).
  step "the page again with 2 steps in flight (depth=2)"
  timeout 200 python3 .ci/device/cdp.py page --chrome "$chrome" --flags "$common $chosen" \
    --label page-depth2 --logs "$logs" --port 9403 --n "$n" --warm "$warm" --timeout 120 \
    --query depth=2 > "$stage/page-depth2.json" < /dev/null
  cat "$stage/page-depth2.json"
  # A hardware adapter with shader-f16 under other flags than the chosen ones: the page again.
  f16_flags=$(python3 -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
hw = lambda d: ((d.get("adapter") or {}).get("high-performance") or {})
has = lambda d: "shader-f16" in hw(d).get("features", []) and not hw(d).get("is_fallback")
chosen = [d for d in rows if d["flags"].endswith(sys.argv[2])]
if not (chosen and has(chosen[0])):
    print(next((d["flags"] for d in rows if has(d)), ""))' "$stage/probes.jsonl" "$chosen")
  if [ -n "$f16_flags" ]; then
    step "the page again where the adapter has shader-f16: $f16_flags"
    timeout 200 python3 .ci/device/cdp.py page --chrome "$chrome" --flags "$f16_flags" \
      --label page-f16 --logs "$logs" --port 9401 --n "$n" --warm "$warm" --timeout 120 \
      > "$stage/page-f16.json" < /dev/null
    cat "$stage/page-f16.json"
  fi
else
  step "no flag set gave a hardware adapter: the page is not run (SwiftShader would take hours)"
fi

step "native 4: runner bench again, after the page"
timeout 120 "$runner" bench -m "$model" --quiet --json -p 0 -n "$n" -r "$native_r" > "$stage/native-bench-after.json" 2> "$logs/native-bench-after.err"
cat "$stage/native-bench-after.json"
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null

step "summary"
python3 .ci/device/page_summary.py "$stage" | tee "$stage/summary.txt"
