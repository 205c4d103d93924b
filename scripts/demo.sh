#!/usr/bin/env bash
# make demo: the main job on one machine, in a few minutes on 2 cores.
#   1. generate a skewed corpus (long-tailed captions, images from icons to large photos) and
#      prefix each caption with what its image looks like ("A wide green picture."), since
#      synth's captions are unrelated to the images and a model could learn nothing from them
#   2. plan it from cheap features and compare mmfeed with the baselines (report)
#   3. start `mmfeed serve` (embedded NATS with JetStream, live report over HTTP)
#   4. train the tiny model with 4 CPU processes, dp 2 × mp 2 (vision and text towers on
#      different ranks), fed by the service, sending step times back as feedback
#   5. print the loss (mean of the first vs the last 10 steps) and the live balance report the
#      service computed from the plan and the feedback
# Output: $DEMO_DIR (default out/demo). Ports: $DEMO_NATS_PORT (4322), $DEMO_HTTP_PORT (8322).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${DEMO_DIR:-out/demo}"
samples="${DEMO_SAMPLES:-2800}"
steps="${DEMO_STEPS:-80}"
nats_port="${DEMO_NATS_PORT:-4322}"
http_port="${DEMO_HTTP_PORT:-8322}"
py=.venv/bin/python
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$out"; mkdir -p "$out"
layout=(--dp 2 --global-batch 32 --micro-batches 2 --resize dynamic --max-pixels 65536)
# dynamic resolution: image tokens follow each image's size (at most 256×256 pixels, the
# tiny model's 32×32 patch grid), so the skew is in the vision tower too.

echo "== 1. synth: $samples samples, strong skew, 2% deliberately broken"
bin/mmfeed synth --out "$out/corpus" --samples "$samples" --seed 7 --bad-fraction 0.02
$py scripts/demo_captions.py "$out/corpus/manifest.jsonl" "$out/corpus/described.jsonl"
manifest="$out/corpus/described.jsonl"

echo; echo "== 2. report: plan from captions and image headers (dp 2, global batch 32, dynamic resolution)"
bin/mmfeed report --input "$manifest" "${layout[@]}" --placement modality

echo; echo "== 3. serve: embedded NATS on 127.0.0.1:$nats_port, live report on http://127.0.0.1:$http_port/"
bin/mmfeed serve --input "$manifest" "${layout[@]}" \
  --mp 2 --placement modality --job demo --data-dir "$out/serve" --recalibrate 10 --ack-wait 30s \
  --nats-listen "127.0.0.1:$nats_port" --http "127.0.0.1:$http_port" >"$out/serve.log" 2>&1 &
serve_pid=$!
trap 'kill $serve_pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$http_port/healthz" >/dev/null && break
  kill -0 $serve_pid 2>/dev/null || { cat "$out/serve.log"; exit 1; }
  sleep 0.3
done

echo; echo "== 4. train: tiny model, 4 CPU processes (dp 2 × mp 2), gloo, $steps steps, lr 1e-3"
# lr 1e-3 with a 5-step warmup: at 3e-4/10 the tiny model needs ~100 steps before the
# contrastive loss leaves its chance level ln(16) + 0.64 ≈ 3.41; this learns from step ~35.
if ! OMP_NUM_THREADS=1 $py -m torch.distributed.run --standalone --nproc-per-node 4 -m mmfeed_trainer \
  --nats "nats://127.0.0.1:$nats_port" --job demo --dp 2 --mp 2 --model tiny --steps "$steps" \
  --lr 1e-3 --warmup 5 --log-every 1 --ckpt-dir "$out/ckpt" >"$out/train.log" 2>&1; then
  tail -40 "$out/train.log"; echo "trainer failed; see $out/train.log and $out/serve.log"; exit 1
fi
grep -E 'rank0 INFO (step|summary|done)' "$out/train.log" | awk 'NR % 10 == 0' || true

echo; echo "== 5. balance report (live, from http://127.0.0.1:$http_port/v1/report)"
curl -sf "http://127.0.0.1:$http_port/v1/report" >"$out/report.json"
curl -sf "http://127.0.0.1:$http_port/" >"$out/report.html"
$py scripts/demo_summary.py "$out/report.json" "$out/train.log"
echo; echo "the HTML report: $out/report.html (live at http://127.0.0.1:$http_port/ while the service runs)"
