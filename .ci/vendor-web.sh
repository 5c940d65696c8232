#!/usr/bin/env bash
# Vendors the chat page's Markdown renderer and sanitiser into web/vendor/ from the npm
# registry, at pinned versions: the page loads them from this server, never from a CDN.
# The copies are committed (minified, with their licences); run this only to change a version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MARKED=18.2.1
DOMPURIFY=3.5.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "marked@$MARKED" "dompurify@$DOMPURIFY" >/dev/null)
for package in "marked-$MARKED" "dompurify-$DOMPURIFY"; do
  mkdir -p "$work/$package" && tar xzf "$work/$package.tgz" -C "$work/$package"
done
mkdir -p web/vendor
# Without their source maps' comments: the maps are not vendored.
grep -v '^//# sourceMappingURL' "$work/marked-$MARKED/package/lib/marked.esm.js" >web/vendor/marked.esm.js
grep -v '^//# sourceMappingURL' "$work/dompurify-$DOMPURIFY/package/dist/purify.min.js" >web/vendor/purify.min.js
cp "$work/marked-$MARKED/package/LICENSE" web/vendor/LICENSE.marked
cp "$work/dompurify-$DOMPURIFY/package/LICENSE" web/vendor/LICENSE.dompurify
printf 'marked %s (MIT)\ndompurify %s (MPL-2.0 OR Apache-2.0)\n' "$MARKED" "$DOMPURIFY" >web/vendor/VERSIONS
