#!/usr/bin/env bash
# make bench: every side-by-side benchmark in one run, ratios into bench/results.json.
# Real data: MMFEED_CORPUS, or the shared corpus built once into the machine cache
# (../shared/corpus/build.sh, about a minute of Debian downloads); without it the
# benchmarks fall back to generated data and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${CACHE:-$HOME/.cache/mmfeed}"
if [ -z "${MMFEED_CORPUS:-}" ]; then
  if [ -f "$cache/corpus/dev/manifest.jsonl" ]; then
    export MMFEED_CORPUS="$cache/corpus"
  elif [ -x ../shared/corpus/build.sh ]; then
    echo "building the shared real corpus into $cache/corpus (once)"
    if OUT="$cache/corpus" WORK="$cache/corpus-src" EDGE=1 ../shared/corpus/build.sh >"$cache/corpus-build.log" 2>&1; then
      export MMFEED_CORPUS="$cache/corpus"
    else
      echo "corpus build failed (see $cache/corpus-build.log); using generated data only"
    fi
  fi
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "corpus:  ${MMFEED_CORPUS:-generated only}"
go run ./bench "$@"
