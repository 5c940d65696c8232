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

# Debian 12's Mesa (22.3) compiles a storage-buffer load whose address differs between SIMD
# lanes into a loop over the lanes; bookworm-backports' Mesa (25.0, same LLVM 15) uses gathers,
# and lavapipe then decodes 2.8-3.1x and prefills 3.3-3.8x faster: the CPU-adapter tests are
# most of CI's time (docs/ci.md, session 19). Other releases keep their own Mesa.
MESA_MIN_VERSION=25.0
BACKPORTS_LIST=/etc/apt/sources.list.d/webshard-bookworm-backports.sources

mesa_is_recent() {
  local version
  version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null) || return 1
  dpkg --compare-versions "$version" ge "$MESA_MIN_VERSION"
}

install_backports_mesa() {
  grep -qs '^VERSION_CODENAME=bookworm$' /etc/os-release || return 0
  mesa_is_recent && return 0
  local sudo=()
  [ "$(id -u)" != 0 ] && sudo=(sudo)
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
      | "${sudo[@]}" tee "$BACKPORTS_LIST" >/dev/null
  fi
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q -t bookworm-backports \
    mesa-vulkan-drivers
  mesa_is_recent || { echo "setup: Mesa is still older than $MESA_MIN_VERSION" >&2; exit 1; }
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
timed "Mesa from bookworm-backports" install_backports_mesa
timed "wasm target" add_wasm_target
timed "wasm-bindgen-cli" install_wasm_bindgen_cli
timed "e2e node modules" install_all_node_modules
timed "openai python client" install_openai_python
timed "jsonschema python" install_jsonschema_python
timed "models" python3 .ci/fetch_models.py
