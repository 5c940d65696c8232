#!/usr/bin/env bash
# Builds the npm package `webshard` from web/ (its JavaScript), npm/ (package.json, README,
# types) and pkg/ (the wasm build: run .ci/build-wasm.sh first), packs it with `npm pack` into
# npm/build/, installs the tarball into the example apps of e2e/examples/ and builds the Vite
# one, for e2e/tests/npm-package.spec.js. Offline: the examples' registry packages are
# installed by setup.sh. Every run starts from an empty npm/build/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SOURCES=(web/openai.js web/openai-request.js web/openai-embeddings.js web/tool-calls.js web/engine-client.js web/worker.js npm/index.d.ts npm/README.md)
# Only what worker.js loads: the package's types are index.d.ts, not wasm-bindgen's.
WASM=(webshard.js webshard_bg.wasm)
BUILD=npm/build
STAGE=$BUILD/webshard

crate_version() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "webshard"))'
}

stage_package() {
  local file
  for file in "${WASM[@]}"; do
    [ -f "pkg/$file" ] || { echo "build-npm: pkg/$file is missing: run .ci/build-wasm.sh first" >&2; exit 1; }
  done
  rm -rf "$BUILD"
  mkdir -p "$STAGE/pkg"
  cp "${SOURCES[@]}" "$STAGE/"
  for file in "${WASM[@]}"; do cp "pkg/$file" "$STAGE/pkg/"; done
  # package.json's version is the crate's, so the two cannot drift apart.
  VERSION=$(crate_version) node -e '
    const fs = require("node:fs");
    const manifest = JSON.parse(fs.readFileSync("npm/package.json", "utf8"));
    const staged = { name: manifest.name, version: process.env.VERSION, ...manifest };
    fs.writeFileSync(process.argv[1], JSON.stringify(staged, null, 2) + "\n");
  ' "$STAGE/package.json"
}

# Prints the tarball's path.
pack_package() {
  local name
  name=$(cd "$BUILD" && npm pack ./webshard --silent)
  echo "$PWD/$BUILD/$name"
}

# `npm install --no-save`: each app's lock pins its registry packages only, since the tarball's
# hash changes with every build.
install_into_examples() {
  local tarball=$1 app
  for app in e2e/examples/*/; do
    (cd "$app" && npm install --no-save --prefer-offline --no-audit --no-fund --loglevel=error "$tarball")
  done
}

stage_package
tarball=$(pack_package)
install_into_examples "$tarball"
(cd e2e/examples/vite && npm run --silent build)
echo "build-npm: $(du -h "$tarball" | cut -f1) $tarball, installed into $(ls -d e2e/examples/*/ | tr '\n' ' ')"
