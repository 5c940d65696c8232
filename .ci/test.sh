#!/usr/bin/env bash
# Every test: set up, then the fetch script's tests, the Rust workspace, the wasm build and its
# browser tests, the npm package (packed and installed into e2e/examples/), and the Playwright
# pages. Everything native builds in the release profile, so the tests, the runner the pages
# talk to and `main.sh` share one build of the dependencies.
# Each step prints its time; the run fails, naming the step, once it passes 85 minutes
# (WEBSHARD_CI_LIMIT_S), so that CI time cannot creep up unseen and a run that would hit CI's
# 90-minute limit fails first, naming its step (docs/ci.md, session 11).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh

LIMIT_S=${WEBSHARD_CI_LIMIT_S:-5100}
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
  if ((status == 124 || status == 137)); then
    echo "test.sh: FAILED: the run passed its limit of $((LIMIT_S / 60)) minutes in step '$name'" >&2
    exit 1
  fi
  if ((status != 0)); then
    echo "test.sh: FAILED in step '$name' (exit $status)" >&2
    exit "$status"
  fi
  TIMINGS+=("$(printf '%6d s  %s' $((SECONDS - start)) "$name")")
  echo "== $name: ok in $((SECONDS - start)) s"
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

# Runs in headless Chromium through chromedriver (webdriver.json in the crate root sets flags);
# release, like build-wasm.sh, so the two share the wasm build of the dependencies.
wasm_tests() {
  # SwiftShader compiles and runs every kernel on the CPU: allow minutes per test.
  # shellcheck disable=SC2046 # one word per flag is intended
  WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test -p webshard --release --target wasm32-unknown-unknown $(wasm_test_targets)
}

e2e_tests() {
  local target_dir
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  (cd e2e && WEBSHARD_RUNNER="$target_dir/release/runner" npx --no-install playwright test)
}
export -f wasm_test_targets wasm_tests e2e_tests

step "set-up" bash .ci/setup.sh
step "format" cargo fmt --all -- --check
step "fetch script tests" python3 -m unittest discover -s .ci -p 'test_*.py'
step "build (workspace tests and runner, release)" \
  cargo test --workspace --release --no-run
step "cargo test (workspace, release)" \
  python3 .ci/run_tests.py --jobs 2 --timings "${TMPDIR:-/tmp}/webshard-test-timings.json" -- --workspace --release
step "wasm build" bash .ci/build-wasm.sh
step "npm package and its example apps" bash .ci/build-npm.sh
if [ -n "$(wasm_test_targets)" ]; then step "wasm tests (headless Chromium)" wasm_tests; fi
if has_e2e_specs; then step "e2e (Playwright)" e2e_tests; fi
echo "== step times"
printf '%s\n' "${TIMINGS[@]}"
echo "test.sh: all passed in $SECONDS s"
