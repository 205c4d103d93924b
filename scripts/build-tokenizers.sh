#!/usr/bin/env bash
# Builds the HuggingFace tokenizers static library that github.com/daulet/tokenizers links,
# from that Go module's own Rust sources, with crates.io dependencies only.
#
# The module's Cargo.toml names a git dependency (tiktoken-rs from a fork branch) that no
# registry here serves; we pin the crates.io release with the same API (see
# scripts/tokenizers/Cargo.lock, committed so every machine resolves the same crates).
#
# scripts/tokenizers/mmfeed_batch.rs adds mmfeed's batch entry points (tokenize/batch.go).
#
# Output: $BUILD/lib/libtokenizers.a and the tokenizer.json files of the module's test/data
# in $BUILD/tokenizers/. The cargo build is cached per module version under $CACHE, so a
# fresh clone on the same machine only copies files.
#
# Usage: scripts/build-tokenizers.sh BUILD_DIR CACHE_DIR
set -euo pipefail
build="$1"; cache="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod=github.com/daulet/tokenizers
go mod download "$mod"
src="$(go list -m -f '{{.Dir}}' "$mod")"
ver="$(go list -m -f '{{.Version}}' "$mod")"
key="$ver-$(cat "$here/tokenizers/Cargo.lock" "$here/tokenizers/mmfeed_batch.rs" "$0" | sha256sum | cut -c1-12)"
work="$cache/tokenizers-$key"
if [ ! -f "$work/libtokenizers.a" ]; then
  echo "building libtokenizers ($mod@$ver) with cargo; takes a few minutes once" >&2
  rm -rf "$work/src"; mkdir -p "$work/src"
  cp -r "$src/src" "$src/Cargo.toml" "$work/src/"
  chmod -R u+w "$work/src"
  # crates.io release instead of the git branch; drop dev-dependencies and benches (not needed).
  sed -i -e 's|^tiktoken-rs = .*|tiktoken-rs = "0.9"|' -e '/^\[dev-dependencies\]/,$d' "$work/src/Cargo.toml"
  cp "$here/tokenizers/Cargo.lock" "$work/src/Cargo.lock"
  # mmfeed's batch entry points (one cgo call per batch; counts without building encodings).
  cp "$here/tokenizers/mmfeed_batch.rs" "$work/src/src/"
  echo 'mod mmfeed_batch;' >>"$work/src/src/lib.rs"
  (cd "$work/src" && CARGO_TARGET_DIR="$work/target" cargo build --release --locked)
  cp "$work/target/release/libtokenizers.a" "$work/libtokenizers.a.tmp"
  mv "$work/libtokenizers.a.tmp" "$work/libtokenizers.a"
fi
mkdir -p "$build/lib" "$build/tokenizers"
cp "$work/libtokenizers.a" "$build/lib/libtokenizers.a"
for f in "$src"/test/data/*.json; do install -m 0644 "$f" "$build/tokenizers/"; done
