#!/usr/bin/env bash
# make demo: the main job on one machine, in a few minutes on 2 cores.
#   1. generate a skewed corpus (long-tailed captions, images from icons to large photos)
#   2. plan it and compare mmfeed with the baselines (report)
#   3. preprocess it into balanced per-rank Arrow shards (shard)
#   4. train the tiny model on the shards with 4 CPU processes (dp 2 × mp 2), when the
#      trainer is installed in the virtualenv
# Output: $DEMO_DIR (default out/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${DEMO_DIR:-out/demo}"
samples="${DEMO_SAMPLES:-1200}"
rm -rf "$out"; mkdir -p "$out"

echo "== 1. synth: $samples samples"
bin/mmfeed synth --out "$out/corpus" --samples "$samples" --seed 7 --bad-fraction 0.02

echo; echo "== 2. report: plan from captions and image headers, dp 2, global batch 32"
bin/mmfeed report --input "$out/corpus/manifest.jsonl" --dp 2 --global-batch 32 --micro-batches 2

echo; echo "== 3. shard: full preprocessing into per-rank Arrow files"
bin/mmfeed shard --input "$out/corpus/manifest.jsonl" --dp 2 --global-batch 32 --micro-batches 2 --out "$out/shards" >"$out/shard.log"
head -2 "$out/shard.log"
echo "quarantined samples and why:"; cut -d'"' -f12 "$out/shards/quarantine.jsonl" | sort | uniq -c

export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}"
if .venv/bin/python -c 'import mmfeed_trainer.__main__' 2>/dev/null; then
  echo; echo "== 4. train: tiny model, 4 CPU processes (dp 2 × mp 2), gloo"
  .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 4 -m mmfeed_trainer \
    --shards "$out/shards" --dp 2 --mp 2 --model tiny --steps "${DEMO_STEPS:-30}"
fi

echo; echo "== balance report: $out/shards/report.html (and report.json)"
tail -n +3 "$out/shard.log"
