#!/usr/bin/env bash
# Builds the wasm package (pkg/) with cargo + wasm-bindgen, as wasm-pack.toml says.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source .ci/env.sh

# wasm-pack.toml as shell variables: crate, profile, target, out_dir, out_name, wasm_opt.
eval "$(python3 - <<'PY'
import shlex, tomllib
with open("wasm-pack.toml", "rb") as f:
    build = tomllib.load(f)["build"]
opt = build.get("wasm-opt", False)
build["wasm-opt"] = " ".join(opt) if isinstance(opt, list) else ("-O" if opt is True else "")
for key in ("crate", "profile", "target", "out-dir", "out-name", "wasm-opt"):
    print(f"{key.replace('-', '_')}={shlex.quote(str(build[key]))}")
PY
)"

cargo build -p "$crate" --lib --profile "$profile" --target wasm32-unknown-unknown
profile_dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
wasm="$target_dir/wasm32-unknown-unknown/$profile_dir/${crate//-/_}.wasm"

wasm-bindgen --target "$target" --out-dir "$out_dir" --out-name "$out_name" "$wasm"
if [ -n "$wasm_opt" ]; then
  PATH="$PATH:$PWD/e2e/node_modules/.bin" wasm-opt $wasm_opt "$out_dir/${out_name}_bg.wasm" \
    -o "$out_dir/${out_name}_bg.wasm"
fi
echo "build-wasm: $(du -h "$out_dir/${out_name}_bg.wasm" | cut -f1) $out_dir/${out_name}_bg.wasm"
