#!/usr/bin/env bash
# Here, before `.ci/device/page.sh go` on the device machine (issue 14: the chat page in
# headless Chromium on the H200). Writes, all git-ignored:
#   .device/bin/     models.toml and SmolLM2's first 2 MiB (its whole 1.79 MB GGUF header) for
#                    run.sh synth (a twin of the real size with random weights)
#   .device/page/c1/ the stripped runner (xz), the wasm package pkg/ (xz), the first part of
#                    Chromium, chromium.parts and chromium.sha256       -> carried by call 1
#   .device/page/c2/ the rest of Chromium                               -> carried by call 2
#   .device/page/c3/ two DejaVu fonts (fonts-dejavu-core): without a font and a fontconfig
#                    config Chromium's renderer dies (Skia FATAL "Not implemented") -> call 2
#   .gl/             Debian's Vulkan loader and GL dispatch .debs for the runner (run.sh setup)
# Chromium is Debian 12's chromium-headless-shell as installed here (apt-get install
# chromium-headless-shell): the binary, its .pak/ICU/V8 snapshot files and Chromium's own
# Vulkan loader from /usr/lib/chromium, plus every shared library `ldd` names except glibc's
# own, in chromium/lib (LD_LIBRARY_PATH for Chromium alone there): 264 MB, 73 MiB as tar.xz -9e.
# BUILD_WASM=1 rebuilds pkg/ first (.ci/build-wasm.sh). PART0_MIB (44): Chromium's share of call
# 1, which must stay under 64 MiB with the ~4 MB working tree and the ~12 MB beside it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source .ci/env.sh
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
runner=${RUNNER:-target/release/runner}
cr=/usr/lib/chromium
[ -x "$cr/chromium-headless-shell" ] || { echo "apt-get install chromium-headless-shell first"; exit 1; }
[ "${BUILD_WASM:-0}" = 1 ] && bash .ci/build-wasm.sh
rm -rf .device/page .device/bin
mkdir -p .device/page/c1 .device/page/c2 .device/page/c3 .device/bin
cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf \
  .device/page/c3/
strip -o .device/page/runner "$runner"
xz -9 -T2 -c .device/page/runner > .device/page/c1/runner.xz
rm .device/page/runner
tar -cf - pkg | xz -9 -T2 > .device/page/c1/pkg.tar.xz
cp .ci/models.toml .device/bin/models.toml
head -c $((2 * 1024 * 1024)) "$model" > ".device/bin/$(basename "$model").head"

work=$(mktemp -d)
mkdir -p "$work/chromium/lib" "$work/chromium/locales"
for f in chromium-headless-shell headless_command_resources.pak headless_lib_data.pak \
  headless_lib_strings.pak icudtl.dat snapshot_blob.bin v8_context_snapshot.bin libvulkan.so.1 \
  libvk_swiftshader.so vk_swiftshader_icd.json libEGL.so libGLESv2.so; do
  cp "$cr/$f" "$work/chromium/"
done
cp "$cr/locales/en-US.pak" "$work/chromium/locales/"
ldd "$cr/chromium-headless-shell" | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | ld-linux-x86-64.so.2) ;;
    *) cp -L "$lib" "$work/chromium/lib/" ;;
  esac
done
dpkg-query -W chromium-headless-shell chromium-common > "$work/chromium/VERSIONS"
tar -cf - -C "$work" chromium | xz -9e -T2 > "$work/chromium.tar.xz"
split -b "${PART0_MIB:-44}M" -d -a 2 "$work/chromium.tar.xz" "$work/chromium.tar.xz.part"
ls "$work"/chromium.tar.xz.part* | wc -l > .device/page/c1/chromium.parts
(cd "$work" && sha256sum chromium.tar.xz.part*) > .device/page/c1/chromium.sha256
mv "$work/chromium.tar.xz.part00" .device/page/c1/
mv "$work"/chromium.tar.xz.part* .device/page/c2/
rm -rf "$work"

if ! ls .gl/libvulkan1_*.deb > /dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  # shellcheck disable=SC2086
  apt-get $o update > /dev/null
  # shellcheck disable=SC2086
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .device/page/c1 .device/page/c2 .device/page/c3 .device/bin .gl
ls -la .device/page/c1 .device/page/c2 .device/page/c3
