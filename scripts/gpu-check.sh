#!/usr/bin/env bash
# GPU check of the bundled trainer: one prepared script for one CUDA device (an H200 lent for
# a few minutes, no network), writing every figure to gpu-check.json. CI never needs a GPU:
# `--dry-run` runs the same stages on CPU with the tiny model (trainer/tests/test_gpu_check.py).
#
#   scripts/gpu-check.sh --prepare   here, with bin/mmfeed: write gpu-check-data/ (carry it)
#   scripts/gpu-check.sh             on the device: the stages below, then gpu-check.json
#   scripts/gpu-check.sh --dry-run   the same stages on CPU (gloo, tiny model, a few steps)
#
# Stages, most important first (a run cut by the time budget keeps the head figures), each
# one torchrun process per device (NCCL is not initialised at world size 1, so no collective
# is timed on one GPU), base model (ViT-B/16 + BERT-base + fusion), bf16, uint8 pixels
# normalised on the device by the prefetcher (pinned memory, side stream):
#   padded           dynamic-resolution synthetic steps around 224 px, captions of 10-77 tokens
#   packed           the same packed (FlexAttention with a document mask on CUDA)
#   emulate          scripts/gpu_emulate.py over gpu-check-data/plans: every micro-batch of a
#                    dp-8 plan (mmfeed vs random strategy) timed rank after rank on the one
#                    device; step time = slowest rank; cost-model R² (an emulation: no collectives)
#   resume           checkpoint at half the steps (resume_first), a new process resumes it
#   ac_full          --ac full
#   ac_compile       --ac selective --compile (inductor per block)
#   elastic          checkpoint at dp 2 (FSDP2, elastic_dp2), resume at dp 1 with --allow-resize:
#                    gloo on CPU (NCCL refuses two ranks on one GPU), tiny model, DCP resharding
#   mixed_precision  FSDP2 bf16 MixedPrecisionPolicy + --cpu-offload; needs dp >= 2 (on one GPU:
#                    skipped and said so in the JSON; the dry run runs it on 2 gloo processes)
# Figures: step time, samples/s, MFU, peak memory, data-wait fraction per stage.
#
# Time: the whole script, its own start-up included, stays within GPU_CHECK_BUDGET seconds
# (default 300, so that a rerun fits a 15-minute device lease; 3600 in a dry run). A stage
# that would start with less than GPU_CHECK_MIN_STAGE (20) seconds left is skipped, and a
# running stage is stopped at the budget (less 15 s to write the JSON); both are listed under
# "skipped" in gpu-check.json with the reason, and the run still succeeds.
#
# Env: MMFEED_PYTHON (default .venv/bin/python, else python3), GPU_CHECK_STEPS (20),
#      GPU_CHECK_BATCH (samples per micro-batch, 32), GPU_CHECK_DATA (gpu-check-data),
#      GPU_CHECK_INPUT (a manifest for --prepare; default a generated corpus), MMFEED_PEAK_TFLOPS,
#      GPU_CHECK_BUDGET, GPU_CHECK_MIN_STAGE.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=gpu OUT=gpu-check.json
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --prepare) MODE=prepare ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PY="${MMFEED_PYTHON:-}"
if [ -z "$PY" ]; then if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else PY=python3; fi; fi
DATA="${GPU_CHECK_DATA:-gpu-check-data}"
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

prepare() {  # $1 folder, $2 samples: a corpus sharded for 8 dp ranks by two strategies (JPEG store: decoded to uint8, small to carry)
  local dir=$1 n=$2 input="${GPU_CHECK_INPUT:-}"
  [ -x bin/mmfeed ] || { echo "gpu-check: bin/mmfeed missing (make build)" >&2; return 1; }
  if [ -z "$input" ]; then
    bin/mmfeed synth --out "$dir/corpus" --samples "$n" --seed 3 >/dev/null
    input=$dir/corpus/manifest.jsonl
  fi
  for s in mmfeed random; do
    bin/mmfeed shard --input "$input" --dp 8 --global-batch 128 --micro-batches 2 --strategy "$s" \
      --resize dynamic --max-pixels 65536 --store jpeg --seed 5 --out "$dir/plans/$s" >/dev/null
  done
  rm -rf "$dir/corpus"
  du -sh "$dir"
}
if [ "$MODE" = prepare ]; then prepare "$DATA" 768; exit 0; fi

LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
if [ "$MODE" = dry ]; then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
  MODEL=tiny BACKEND=aot_eager STEPS="${GPU_CHECK_STEPS:-3}" BATCH="${GPU_CHECK_BATCH:-4}" NGPU=0
  GRIDS=1x1,1x2,2x1,2x2 TEXT=(3 12) EMU_STEPS=2
  echo "gpu-check: dry run on CPU (tiny model, gloo, torch.compile backend $BACKEND)"
else
  NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
  if [ "$NGPU" -eq 0 ]; then echo "gpu-check: no CUDA device visible (use --dry-run on CPU)" >&2; exit 1; fi
  MODEL=base BACKEND=inductor STEPS="${GPU_CHECK_STEPS:-20}" BATCH="${GPU_CHECK_BATCH:-32}"
  GRIDS=14x14,16x12,12x16,16x16,10x14 TEXT=(10 77) EMU_STEPS=8
  "$PY" -c 'import torch; print("gpu-check:", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0), "torch", torch.__version__)'
fi
SKIP=$(( STEPS / 4 ))
peak=()
if [ -n "${MMFEED_PEAK_TFLOPS:-}" ]; then peak=(--peak-tflops "$MMFEED_PEAK_TFLOPS"); fi
declare -A SKIPPED=()
BUDGET="${GPU_CHECK_BUDGET:-300}"
[ "$MODE" = dry ] && BUDGET="${GPU_CHECK_BUDGET:-3600}"  # a loaded CI machine is slow, not a lent GPU
MIN_STAGE="${GPU_CHECK_MIN_STAGE:-20}" RESERVE=15  # RESERVE: writing gpu-check.json at the end
left() { echo $(( BUDGET - RESERVE - SECONDS )); }
over_budget() {  # $1 stage: true (and recorded) when too little of the time budget is left to start it
  if [ "$(left)" -lt "$MIN_STAGE" ]; then
    SKIPPED[$1]="over the time budget (${SECONDS} s of ${BUDGET} s spent)"
    echo; echo "== $1: skipped (${SKIPPED[$1]})"
    return 0
  fi
  return 1
}
bounded() {  # $1 stage, $2 seconds at most, rest: command, its output to $LOGS/$1.out and .err;
  # 0, 1 after a failure, 2 when stopped at the time budget (recorded under "skipped")
  local stage=$1 limit=$2 rc=0; shift 2
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  [ "$limit" -ge 1 ] || limit=1
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$stage.out" 2>"$LOGS/$stage.err" || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    SKIPPED[$stage]="stopped at the time budget after ${limit} s (${SECONDS} s of ${BUDGET} s spent)"
    echo "== $stage: ${SKIPPED[$stage]}"
    rm -f "$LOGS/$stage.json"
    return 2
  fi
  return "$rc"
}

trainer() {  # $1 stage, $2 processes, rest: flags; the run's JSON summary goes to $LOGS/$1.json
  local stage=$1 n=$2 rc=0; shift 2
  if over_budget "$stage"; then return 0; fi
  echo; echo "== $stage: $n process(es), $*"
  local t0=$SECONDS
  bounded "$stage" 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" -m mmfeed_trainer "$@" || rc=$?
  [ "$rc" -eq 2 ] && return 0
  [ "$rc" -eq 0 ] || { tail -30 "$LOGS/$stage.err"; return 1; }
  grep '^{' "$LOGS/$stage.out" | tail -1 | tee "$LOGS/$stage.json"
  grep -h 'resumed from\|resized:' "$LOGS/$stage.err" | sed 's/^.* INFO /  /' || true
  echo "  ($((SECONDS - t0)) s)"
}
ran() { [ -s "$LOGS/$1.json" ]; }  # $1 stage: it ran to its end
synth() {  # the synthetic stream of the throughput stages
  echo --synthetic --model "$MODEL" --warmup 5 --lr 1e-4 --log-every 10 --metrics-skip "$SKIP" \
    --synth-samples $((BATCH * 3 / 4)) "$BATCH" --synth-micro-batches 2 --synth-grids "$GRIDS" \
    --synth-text "${TEXT[@]}" --synth-dtype uint8 --synth-distinct 8 --prefetch 3
}
BF16=(--bf16 on)
[ "$MODE" = dry ] && BF16=(--bf16 off)  # CPU bf16 autocast is slow and not what a GPU runs

emulate() {  # dp-8 plans (carried, or written here in a dry run), ranks in turn on one device
  local plans=$DATA/plans rc=0
  if over_budget emulate; then return 0; fi
  if [ "$MODE" = dry ] && [ ! -d "$plans" ] && [ -x bin/mmfeed ]; then
    plans=$LOGS/data/plans
    prepare "$LOGS/data" 256 >/dev/null
  fi
  if [ ! -d "$plans" ]; then
    SKIPPED[emulate]="no $plans (scripts/gpu-check.sh --prepare writes it where bin/mmfeed is)"
    echo; echo "== emulate: skipped (${SKIPPED[emulate]})"
    return 0
  fi
  echo; echo "== emulate: dp-8 plans of $plans, ranks in turn on one device"
  bounded emulate 240 "$PY" scripts/gpu_emulate.py --plans "$plans" --model "$MODEL" --steps "$EMU_STEPS" \
    --out "$LOGS/emulate.json" || rc=$?
  [ "$rc" -eq 2 ] && return 0
  [ "$rc" -eq 0 ] || { tail -30 "$LOGS/emulate.err"; return 1; }
  tail -1 "$LOGS/emulate.out"
}

CK=$(mktemp -d)
trap 'rm -rf "$LOGS" "$CK"' EXIT
# shellcheck disable=SC2046
trainer padded 1 $(synth) --steps "$STEPS" "${BF16[@]}" "${peak[@]}"
# shellcheck disable=SC2046
trainer packed 1 $(synth) --steps "$STEPS" --pack "${BF16[@]}" "${peak[@]}"
emulate
# shellcheck disable=SC2046
trainer resume_first 1 $(synth) --steps "$((STEPS / 2))" "${BF16[@]}" --ckpt-dir "$CK/same"
if ran resume_first; then
  # shellcheck disable=SC2046
  trainer resume 1 $(synth) --steps "$STEPS" "${BF16[@]}" --ckpt-dir "$CK/same" "${peak[@]}"
  ! ran resume || grep -q 'resumed from' "$LOGS/resume.err" || { echo "gpu-check: the resume stage did not resume" >&2; exit 1; }
else
  SKIPPED[resume]=${SKIPPED[resume]:-"resume_first did not run"}
fi
# shellcheck disable=SC2046
trainer ac_full 1 $(synth) --steps "$STEPS" --ac full "${BF16[@]}" "${peak[@]}"
# shellcheck disable=SC2046
trainer ac_compile 1 $(synth) --steps "$STEPS" --ac selective --compile --compile-backend "$BACKEND" "${BF16[@]}" "${peak[@]}"
small=(--synthetic --model tiny --synth-samples 2 5 --synth-micro-batches 2 --log-every 1 --warmup 1)
CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 trainer elastic_dp2 2 "${small[@]}" --steps 3 --dp 2 --fsdp --ckpt-dir "$CK/elastic"
if ran elastic_dp2; then
  CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 trainer elastic 1 "${small[@]}" --steps 6 --dp 1 --allow-resize --ckpt-dir "$CK/elastic"
  ! ran elastic || grep -q 'resized: checkpoint dp 2, this run dp 1' "$LOGS/elastic.err" || { echo "gpu-check: the elastic stage did not resize" >&2; exit 1; }
else
  SKIPPED[elastic]=${SKIPPED[elastic]:-"elastic_dp2 did not run"}
fi
if [ "$MODE" = dry ] || [ "$NGPU" -ge 2 ]; then
  n=2; [ "$MODE" = dry ] || n=$NGPU
  # shellcheck disable=SC2046
  trainer mixed_precision "$n" $(synth) --steps "$STEPS" --dp "$n" --fsdp --mixed-precision --cpu-offload --bf16 off "${peak[@]}"
else
  SKIPPED[mixed_precision]="FSDP2 is applied over dp >= 2 only; one GPU cannot hold two NCCL ranks"
  echo; echo "== mixed_precision: skipped (${SKIPPED[mixed_precision]})"
fi

skipped_json=$(for k in "${!SKIPPED[@]}"; do printf '%s\t%s\n' "$k" "${SKIPPED[$k]}"; done)
MODE=$MODE SKIPPED_TSV=$skipped_json BUDGET=$BUDGET ELAPSED=$SECONDS "$PY" - "$LOGS" "$OUT" <<'EOF'
import json, os, sys, time
import torch
logs, out = sys.argv[1], sys.argv[2]
stages = {}
for name in sorted(os.listdir(logs)):
    if name.endswith(".json"):
        with open(os.path.join(logs, name)) as f:
            text = f.read().strip()
        stages[name[:-5]] = json.loads(text) if text else None
skipped = dict(line.split("\t", 1) for line in os.environ["SKIPPED_TSV"].splitlines() if line)
doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": os.environ["MODE"],
       "torch": torch.__version__,
       "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
       "budget_s": int(os.environ["BUDGET"]), "elapsed_s": int(os.environ["ELAPSED"]),
       "stages": stages, "skipped": skipped}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
print(f"gpu-check: wrote {out} ({len(stages)} stages, {len(skipped)} skipped, "
      f"{doc['elapsed_s']} s of a {doc['budget_s']} s budget before it)")
EOF
