#!/usr/bin/env bash
# Every test: set up, then the fetch script's tests, the Rust workspace's kernel and model tests,
# the wasm build, the npm package (packed and installed into e2e/examples/), then the workspace's
# process tests beside the wasm build's browser tests and the Playwright pages. Everything native
# builds once, in the `ci` profile (release without thin local LTO, Cargo.toml says why), so the
# tests and the runner the pages talk to share one build.
# Each step prints its time; the run fails, naming the step, once it passes 85 minutes
# (WEBSHARD_CI_LIMIT_S), so that CI time cannot creep up unseen and a run that would hit CI's
# 90-minute limit fails first, naming its step (docs/ci.md, session 11).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh

LIMIT_S=${WEBSHARD_CI_LIMIT_S:-5100}
# The native build's Cargo profile (Cargo.toml's `[profile.ci]`): the tests' and the runner's.
NATIVE_PROFILE=ci
export NATIVE_PROFILE
TIMINGS=()

# Runs "$@" (a command or one of the functions below) as step $1, within what is left of the limit.
step() {
  local name=$1 start=$SECONDS status=0
  shift
  local left=$((LIMIT_S - SECONDS))
  echo "== $name"
  if ((left > 0)); then
    timeout --kill-after=30 "$left" bash -c '"$@"' _ "$@" || status=$?
  else
    status=124
  fi
  TIMINGS+=("$(printf '%6d s  %s' $((SECONDS - start)) "$name")")
  if ((status == 124 || status == 137)); then
    step_times
    echo "test.sh: FAILED: the run passed its limit of $((LIMIT_S / 60)) minutes in step '$name'" >&2
    exit 1
  fi
  if ((status != 0)); then
    step_times
    echo "test.sh: FAILED in step '$name' (exit $status)" >&2
    exit "$status"
  fi
  echo "== $name: ok in $((SECONDS - start)) s"
}

# The steps so far, the last one failed or not: printed last, as CI shows a run's last lines.
step_times() {
  echo "== step times"
  printf '%s\n' "${TIMINGS[@]}"
}

# Test targets holding #[wasm_bindgen_test]s: --lib for src/, --test NAME for tests/NAME.rs.
wasm_test_targets() {
  grep -rqs '#\[wasm_bindgen_test\]' src && echo --lib
  local file
  for file in $(grep -ls '#\[wasm_bindgen_test\]' tests/*.rs); do
    echo --test "$(basename "$file" .rs)"
  done
}

has_e2e_specs() {
  find e2e/tests -name '*.spec.*' -print -quit 2>/dev/null | grep -q .
}

# The wasm build needs nothing the native build or the cargo tests make, so it starts once
# set-up is done and runs beside them at the lowest CPU priority, taking only the time they leave
# idle (the single-threaded front end and links of the big crates, the kernel and model tests'
# gaps). It has a target directory of its own: in the tests' one, cargo would make the native
# build wait on its lock. Its output and exit status land in $WASM_BUILD_DIR; the "wasm build"
# step waits for them (docs/ci.md, sessions 14 and 42).
WASM_TARGET_DIR="$PWD/target/wasm-build"
WASM_BUILD_DIR="${TMPDIR:-/tmp}/webshard-wasm-build-$$"
export WASM_TARGET_DIR WASM_BUILD_DIR
start_wasm_build() {
  mkdir -p "$WASM_BUILD_DIR"
  # A session of its own, so that a run ending early stops the whole build (cargo, rustc).
  setsid bash -c 'status=0
    CARGO_TARGET_DIR="$WASM_TARGET_DIR" nice -n 19 bash .ci/build-wasm.sh >"$WASM_BUILD_DIR/log" 2>&1 || status=$?
    echo "$status" >"$WASM_BUILD_DIR/status"' &
  WASM_BUILD_PID=$!
  trap 'kill -- -"$WASM_BUILD_PID" 2>/dev/null || true' EXIT
}

# Prints the background wasm build's output once it ends; fails as it did.
wait_wasm_build() {
  while [ ! -s "$WASM_BUILD_DIR/status" ]; do sleep 2; done
  cat "$WASM_BUILD_DIR/log"
  return "$(cat "$WASM_BUILD_DIR/status")"
}

# Runs in headless Chromium through chromedriver (webdriver.json in the crate root sets flags);
# release and in the wasm build's target directory, so the two share the wasm build of the
# dependencies.
wasm_tests() {
  # SwiftShader compiles and runs every kernel on the CPU: allow minutes per test.
  # shellcheck disable=SC2046 # one word per flag is intended
  WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    CARGO_TARGET_DIR="$WASM_TARGET_DIR" cargo test -p webshard --release --target wasm32-unknown-unknown $(wasm_test_targets)
}

# The native runners the pages talk to (donors, `generate` for the ids to match) take the model
# tests' lavapipe and vector width (`run_tests.py --model-drivers`, which says why).
e2e_tests() {
  local target_dir drivers
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  mapfile -t drivers < <(python3 .ci/run_tests.py --model-drivers)
  (cd e2e && env "${drivers[@]}" WEBSHARD_RUNNER="$target_dir/$NATIVE_PROFILE/runner" npx --no-install playwright test)
}

# Runs "$@" as part NAME of a step, printing its time or how it failed; returns its status.
part() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "== $name"
  "$@" || status=$?
  echo "== $name: $([ "$status" = 0 ] && echo ok || echo "FAILED (exit $status)") in $((SECONDS - start)) s"
  return "$status"
}

# The one-at-a-time process tests (runners talking over sockets, heartbeats, timeouts) beside the
# browser tests: each half leaves much of the two cores idle (the process tests wait on sockets
# and timers, Playwright on pages and peers; Playwright alone kept ~64% of them busy), and
# neither shares the cores with the CPU-bound kernel and model tests, which ran before
# (docs/ci.md, session 42). The process tests' output is printed whole once both halves end, or
# when the step's time runs out.
process_and_browser_tests() {
  local log="${TMPDIR:-/tmp}/webshard-process-tests-$$.log" status=0 browsers=0 pid
  python3 .ci/run_tests.py --jobs 2 --phase alone \
    --timings "${TMPDIR:-/tmp}/webshard-test-timings-alone.json" -- --workspace --profile "$NATIVE_PROFILE" >"$log" 2>&1 &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid"; cat "$log"; exit 124' TERM
  if [ -n "$(wasm_test_targets)" ]; then part "wasm tests (headless Chromium)" wasm_tests || browsers=$?; fi
  if has_e2e_specs; then part "e2e (Playwright)" e2e_tests || browsers=$?; fi
  echo "== process tests (one at a time, beside the browser tests)"
  wait "$pid" || status=$?
  cat "$log"
  echo "== process tests: $([ "$status" = 0 ] && echo ok || echo "FAILED (exit $status)")"
  ((status == 0)) || return "$status"
  return "$browsers"
}
export -f wasm_test_targets wasm_tests e2e_tests wait_wasm_build has_e2e_specs part process_and_browser_tests

step "set-up" bash .ci/setup.sh
start_wasm_build
step "format" cargo fmt --all -- --check
step "fetch script tests" python3 -m unittest discover -s .ci -p 'test_*.py'
step "build (workspace tests and runner, $NATIVE_PROFILE profile; the wasm build beside it)" \
  cargo test --workspace --profile "$NATIVE_PROFILE" --no-run
step "kernel and model tests, two at a time (the wasm build beside them)" \
  python3 .ci/run_tests.py --jobs 2 --phase paired --timings "${TMPDIR:-/tmp}/webshard-test-timings.json" -- --workspace --profile "$NATIVE_PROFILE"
step "wasm build (what was left of it)" wait_wasm_build
step "npm package and its example apps" bash .ci/build-npm.sh
step "process tests beside the wasm and Playwright tests" process_and_browser_tests
step_times
echo "test.sh: all passed in $SECONDS s"
