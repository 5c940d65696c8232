#!/usr/bin/env bash
# Idempotent set-up for a Debian 12 machine with rustup's toolchain: system packages, the wasm
# target and wasm-bindgen-cli, the e2e node modules, and the models. Skips what is present.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh

APT_PACKAGES=(mesa-vulkan-drivers libvulkan1 chromium-headless-shell chromium-driver
  python3 python3-pip nodejs npm ca-certificates lld)

timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "setup: $name done in $((SECONDS - start)) s"
}

deb_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

node_is_recent() {
  command -v node >/dev/null && command -v npm >/dev/null \
    && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 18 ]
}

python_is_usable() {
  command -v python3 >/dev/null && python3 -c 'import tomllib' 2>/dev/null \
    && python3 -m pip --version >/dev/null 2>&1
}

missing_packages() {
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    case $pkg in
      nodejs | npm) node_is_recent && continue ;;
      python3 | python3-pip) python_is_usable && continue ;;
    esac
    deb_installed "$pkg" || echo "$pkg"
  done
  # rustc links through cc, and crates such as ring compile C.
  command -v cc >/dev/null || echo "gcc libc6-dev"
}

install_apt_packages() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [ -z "$missing" ] && return
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: $missing" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup: installing $missing"
  "${sudo[@]}" apt-get update -q
  # shellcheck disable=SC2086 # word splitting of the package list is intended
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q $missing
}

# A second lavapipe, for the tests that run models: bookworm-backports' Mesa 25.0 (same LLVM 15),
# unpacked under the cache, the system's Mesa untouched. Debian 12's lavapipe (22.3) loads a
# storage buffer lane by lane where 25.0 gathers, so 25.0 runs a model about 3x faster; but it
# compiles a pipeline about 3.4x slower, and the kernel tests compile hundreds of variants and
# run each once. So `.ci/run_tests.py` points the Vulkan loader at this one for every test
# module but the kernel tests (docs/ci.md, session 19). Other releases: nothing to do.
LAVAPIPE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/webshard/lavapipe-backports"
BACKPORTS_LIST=/etc/apt/sources.list.d/webshard-bookworm-backports.sources

install_backports_lavapipe() {
  grep -qs '^VERSION_CODENAME=bookworm$' /etc/os-release || return 0
  [ -s "$LAVAPIPE_DIR/lvp_icd.json" ] && return 0
  local sudo=()
  [ "$(id -u)" != 0 ] && sudo=(sudo)
  # The source only lets apt fetch from it (backports are never installed unasked).
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
      | "${sudo[@]}" tee "$BACKPORTS_LIST" >/dev/null
    "${sudo[@]}" apt-get update -q
  fi
  local work
  work=$(mktemp -d)
  # apt checks the package against the archive's signed index.
  (cd "$work" && apt-get download -q -t bookworm-backports mesa-vulkan-drivers)
  dpkg-deb -x "$work"/mesa-vulkan-drivers_*.deb "$work/root"
  mkdir -p "$LAVAPIPE_DIR"
  cp "$work/root/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so" "$LAVAPIPE_DIR/"
  # The package's manifest (lvp_icd.json, lvp_icd.x86_64.json in older ones), pointed at the copy.
  local manifest
  manifest=$(find "$work/root/usr/share/vulkan/icd.d" -name 'lvp_icd*.json' | head -n 1)
  [ -n "$manifest" ] || { echo "setup: no lavapipe manifest in mesa-vulkan-drivers" >&2; exit 1; }
  sed "s#\"library_path\": *\"[^\"]*\"#\"library_path\": \"$LAVAPIPE_DIR/libvulkan_lvp.so\"#" \
    "$manifest" > "$LAVAPIPE_DIR/lvp_icd.json.part"
  grep -q "$LAVAPIPE_DIR/libvulkan_lvp.so" "$LAVAPIPE_DIR/lvp_icd.json.part" \
    || { echo "setup: could not point $manifest at the unpacked lavapipe" >&2; exit 1; }
  mv "$LAVAPIPE_DIR/lvp_icd.json.part" "$LAVAPIPE_DIR/lvp_icd.json"
  rm -rf "$work"
}

add_wasm_target() {
  rustup target list --installed | grep -qx wasm32-unknown-unknown \
    || rustup target add wasm32-unknown-unknown
}

# The CLI must match the wasm-bindgen crate exactly (schema check), so read Cargo.lock.
locked_wasm_bindgen_version() {
  [ -f Cargo.lock ] || cargo metadata --format-version 1 >/dev/null
  awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock
}

install_wasm_bindgen_cli() {
  local version
  version=$(locked_wasm_bindgen_version)
  [ -n "$version" ] || { echo "setup: wasm-bindgen not found in Cargo.lock" >&2; exit 1; }
  if [ "$(wasm-bindgen --version 2>/dev/null)" = "wasm-bindgen $version" ]; then return; fi
  # Not --locked: its lock pins a webpki-roots version the registry no longer has.
  cargo install wasm-bindgen-cli --version "=$version"
}

# npm ci in folder $1 only when its package.json or package-lock.json changed since the last
# install there.
install_node_modules() {
  local dir=$1 stamp=$1/node_modules/.installed-lock.sha256 want
  want=$(sha256sum "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && return
  (cd "$dir" && npm ci --no-audit --no-fund)
  # A package with no dependencies gets no node_modules from npm ci.
  mkdir -p "$dir/node_modules"
  echo "$want" >"$stamp"
}

# Playwright, then the npm package's example apps (their registry packages: vite, typescript;
# .ci/build-npm.sh installs the package itself).
install_all_node_modules() {
  local dir
  for dir in e2e e2e/examples/*/; do install_node_modules "${dir%/}"; done
}

# The official OpenAI Python client, pinned, for the API client tests (api_clients.rs).
OPENAI_PYTHON_VERSION=3.51.0
install_openai_python() {
  local have
  have=$(python3 -c 'import openai; print(openai.__version__)' 2>/dev/null || true)
  [ "$have" = "$OPENAI_PYTHON_VERSION" ] && return
  python3 -m pip install --user --quiet "openai==$OPENAI_PYTHON_VERSION"
}

# Python's `jsonschema`, pinned, to validate structured output in the client tests.
JSONSCHEMA_PYTHON_VERSION=4.26.0
install_jsonschema_python() {
  local have
  have=$(python3 -c 'import importlib.metadata as m; print(m.version("jsonschema"))' 2>/dev/null || true)
  [ "$have" = "$JSONSCHEMA_PYTHON_VERSION" ] && return
  python3 -m pip install --user --quiet "jsonschema==$JSONSCHEMA_PYTHON_VERSION"
}

timed "apt packages" install_apt_packages
timed "lavapipe from bookworm-backports" install_backports_lavapipe
timed "wasm target" add_wasm_target
timed "wasm-bindgen-cli" install_wasm_bindgen_cli
timed "e2e node modules" install_all_node_modules
timed "openai python client" install_openai_python
timed "jsonschema python" install_jsonschema_python
timed "models" python3 .ci/fetch_models.py
