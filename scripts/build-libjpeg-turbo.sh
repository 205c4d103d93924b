#!/usr/bin/env bash
# Builds libjpeg-turbo 3.x (the generation Pillow's wheels bundle) as a static library with
# SIMD, from the source that the turbojpeg-sys crate vendors on crates.io, with cargo + CMake
# + NASM (scripts/libjpeg-turbo/Cargo.toml; Cargo.lock committed so every machine resolves
# the same crates). imgproc links it with the build tag turbojpeg3.
#
# Output: $BUILD/libjpeg-turbo/{lib/libturbojpeg.a,include/{turbojpeg,jconfig}.h,VERSION}. The cargo
# build is cached under $CACHE per content of this script and the Cargo files, so a fresh
# clone on the same machine only copies files. Exits non-zero when cargo, cmake or nasm is
# missing or the build fails; the Makefile then falls back to Debian's libturbojpeg.
#
# Usage: scripts/build-libjpeg-turbo.sh BUILD_DIR CACHE_DIR
set -euo pipefail
build="$1"; cache="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
proj="$here/libjpeg-turbo"
key="$(cat "$proj/Cargo.toml" "$proj/Cargo.lock" "$0" | sha256sum | cut -c1-12)"
work="$cache/libjpeg-turbo-$key"
out="$build/libjpeg-turbo"
if [ -f "$out/KEY" ] && [ "$(cat "$out/KEY")" = "$key" ] && [ -f "$out/lib/libturbojpeg.a" ]; then
  exit 0
fi
if [ ! -f "$work/lib/libturbojpeg.a" ]; then
  for tool in cargo cmake nasm; do
    command -v "$tool" >/dev/null || { echo "build-libjpeg-turbo: $tool not found" >&2; exit 1; }
  done
  echo "building libjpeg-turbo 3.x (crates.io turbojpeg-sys) with cargo + CMake; takes a few minutes once" >&2
  rm -rf "$work"; mkdir -p "$work"
  cp -r "$proj" "$work/src"
  (cd "$work/src" && TURBOJPEG_SOURCE=vendor TURBOJPEG_STATIC=1 CARGO_TARGET_DIR="$work/target" \
    cargo build --release --locked >&2)
  built="$(ls -d "$work"/target/release/build/turbojpeg-sys-*/out | head -1)"
  mkdir -p "$work/lib" "$work/include"
  cp "$built/include/turbojpeg.h" "$built/include/jconfig.h" "$work/include/"
  sed -n 's/^#define LIBJPEG_TURBO_VERSION \(.*\)$/\1/p' "$built/include/jconfig.h" >"$work/VERSION"
  cp "$built/lib/libturbojpeg.a" "$work/lib/libturbojpeg.a.tmp"
  mv "$work/lib/libturbojpeg.a.tmp" "$work/lib/libturbojpeg.a"
  rm -rf "$work/target" "$work/src"
fi
rm -rf "$out"; mkdir -p "$out"
cp -r "$work/lib" "$work/include" "$work/VERSION" "$out/"
echo "$key" >"$out/KEY"
