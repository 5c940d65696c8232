#!/usr/bin/env bash
# Every test: set up, then the fetch script's tests, the Rust workspace (debug), the wasm build
# and its browser tests when there are any, and the Playwright pages when e2e/tests has specs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh
bash .ci/setup.sh

step() {
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  "$@"
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

# Runs in headless Chromium through chromedriver (webdriver.json in the crate root sets flags).
wasm_tests() {
  # SwiftShader compiles and runs every kernel on the CPU: allow minutes per test.
  # shellcheck disable=SC2046 # one word per flag is intended
  WASM_BINDGEN_TEST_TIMEOUT="${WASM_BINDGEN_TEST_TIMEOUT:-900}" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    cargo test -p webshard --target wasm32-unknown-unknown $(wasm_test_targets)
}

e2e_tests() {
  (cd e2e && npx --no-install playwright test)
}

step "format" cargo fmt --all -- --check
step "fetch script tests" python3 -m unittest discover -s .ci -p 'test_*.py'
step "cargo test (workspace, debug)" cargo test --workspace
step "wasm build" bash .ci/build-wasm.sh
if [ -n "$(wasm_test_targets)" ]; then step "wasm tests (headless Chromium)" wasm_tests; fi
if has_e2e_specs; then step "e2e (Playwright)" e2e_tests; fi
echo "test.sh: all passed in $SECONDS s"
