# Sourced by the CI scripts: the environment every step shares. Safe to source twice.

export PATH="$HOME/.cargo/bin:$PATH"

# wgpu's GL backend (EGL) insists on a private runtime dir; without one it prints
# "XDG_RUNTIME_DIR is invalid" and may fail to create an adapter.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ] || [ ! -O "$XDG_RUNTIME_DIR" ] \
  || [ "$(stat -c %a "$XDG_RUNTIME_DIR")" != 700 ]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/webshard-runtime-$(id -u)"
  mkdir -p "$XDG_RUNTIME_DIR"
  chmod 700 "$XDG_RUNTIME_DIR"
fi

# Browsers come from apt; Playwright must never download its own.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
export WEBSHARD_CHROMIUM="${WEBSHARD_CHROMIUM:-/usr/lib/chromium/chromium-headless-shell}"
export CHROMEDRIVER="${CHROMEDRIVER:-/usr/bin/chromedriver}"

# The second lavapipe set-up unpacks on Debian 12 (.ci/setup.sh says why); only
# .ci/run_tests.py uses it, for the test modules that run models.
lavapipe_icd="${XDG_CACHE_HOME:-$HOME/.cache}/webshard/lavapipe-backports/lvp_icd.json"
if [ -s "$lavapipe_icd" ]; then
  export WEBSHARD_FAST_LAVAPIPE_ICD="$lavapipe_icd"
fi
unset lavapipe_icd
