#!/usr/bin/env bash
# GPU check of the bundled trainer: one prepared script for one CUDA device (an H200 lent for
# a few minutes, no network), writing every figure to gpu-check.json. CI never needs a GPU:
# `--dry-run` runs the same stages on CPU with the tiny model (trainer/tests/test_gpu_check.py).
#
#   scripts/gpu-check.sh --prepare   here, with bin/mmfeed: write gpu-check-data/ (carry it; < 64 MiB)
#   scripts/gpu-check.sh             on the device: the stages below, then gpu-check.json
#   scripts/gpu-check.sh --dry-run   the same stages on CPU (gloo, tiny model, a few steps)
#
# The device needs a clone of the repository, gpu-check-data/ and a Python with torch (its
# own, no virtualenv, no network): MMFEED_PYTHON, else .venv/bin/python, else python3.
# Every stage records ok | failed | stopped (its exit status, seconds and the tail of its log)
# and the next stage runs regardless; the logs stay in gpu-check-logs/ beside the JSON (the
# name of --out without .json, plus -logs). The script exits 1 when a stage failed, after
# writing the JSON. Stages, most important first (the time budget keeps the head figures;
# the compile-heavy ones come after padded, emulate and resume), base model (ViT-B/16 +
# BERT-base + fusion), bf16, uint8 pixels normalised on the device by the prefetcher; a
# single-process stage runs `python -m mmfeed_trainer` without torchrun (at world size 1 no
# process group is made, so no collective is timed on one GPU):
#   padded           dynamic-resolution synthetic steps around 224 px, captions of 10-77 tokens,
#                    96-128 samples a micro-batch (~20 TFLOP: not launch-bound)
#   emulate          scripts/gpu_emulate.py over gpu-check-data/plans: every micro-batch of a
#                    dp-8 plan (mmfeed vs random strategy, 48 samples a micro-batch) timed rank
#                    after rank on the one device; step time = slowest rank; cost-model R²
#   resume_first     checkpoint at half the steps; then
#   resume           a new process resumes it
#   packed           the padded stage packed (FlexAttention with a document mask: compiles)
#   ac_full          --ac full
#   ac_compile       --ac selective --compile (inductor per block: the longest compile)
#   elastic          checkpoint at dp 2 (FSDP2, elastic_dp2), resume at dp 1 with --allow-resize:
#                    gloo on CPU (NCCL refuses two ranks on one GPU), tiny model, DCP resharding
#   mixed_precision  FSDP2 bf16 MixedPrecisionPolicy + --cpu-offload; needs dp >= 2 (on one GPU:
#                    skipped and said so in the JSON; the dry run runs it on 2 gloo processes)
# Figures: step time, samples/s, MFU, peak memory, data-wait fraction and the warm-up
# (compile) seconds per stage; the JSON also records python, torch, CUDA, driver and device.
#
# Time: the whole script, its own start-up included, stays within GPU_CHECK_BUDGET seconds
# (default 300, so that a rerun fits a 15-minute device lease; 3600 in a dry run). A stage
# that would start with less than GPU_CHECK_MIN_STAGE (20) seconds left is skipped, and a
# running stage is stopped at the budget (less 15 s to write the JSON) or after 240 s.
#
# Env: MMFEED_PYTHON, GPU_CHECK_STEPS (20), GPU_CHECK_BATCH (most samples per micro-batch, 128),
#      GPU_CHECK_DATA (gpu-check-data), GPU_CHECK_INPUT (a manifest for --prepare; default a
#      generated corpus), MMFEED_PEAK_TFLOPS, GPU_CHECK_BUDGET, GPU_CHECK_MIN_STAGE,
#      GPU_CHECK_ONLY (comma-separated stages to run; the others are skipped),
#      GPU_CHECK_FAIL (comma-separated stages made to fail: a test hook).
set -uo pipefail  # not -e: a stage that fails is recorded and the next one runs
cd "$(dirname "$0")/.." || exit 1
MODE=gpu OUT=gpu-check.json
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --prepare) MODE=prepare ;;
    --out) OUT=${2:?--out needs a file}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
DATA="${GPU_CHECK_DATA:-gpu-check-data}"
MAX_DATA=$((64 << 20))  # what a device call carries, the repository included

prepare() {  # $1 folder, $2 samples, $3 global batch, $4 epochs: a corpus sharded for 8 dp ranks by
  # two strategies (JPEG store: decoded to uint8; samples stored once, one index per epoch)
  local dir=$1 n=$2 gb=$3 epochs=$4 input="${GPU_CHECK_INPUT:-}" s bytes
  [ -x bin/mmfeed ] || { echo "gpu-check: bin/mmfeed missing (make build)" >&2; return 1; }
  if [ -z "$input" ]; then
    bin/mmfeed synth --out "$dir/corpus" --samples "$n" --seed 3 >/dev/null || return 1
    input=$dir/corpus/manifest.jsonl
  fi
  for s in mmfeed random; do
    bin/mmfeed shard --input "$input" --dp 8 --global-batch "$gb" --micro-batches 2 --strategy "$s" \
      --epochs "$epochs" --tail pad --resize dynamic --max-pixels 65536 --store jpeg --seed 5 \
      --out "$dir/plans/$s" >/dev/null || return 1
  done
  rm -rf "$dir/corpus"
  bytes=$(du -sb "$dir" | cut -f1)
  if [ "$bytes" -gt "$MAX_DATA" ]; then
    echo "gpu-check: $dir is $((bytes >> 20)) MiB, over the $((MAX_DATA >> 20)) MiB a device call carries" >&2
    return 1
  fi
  du -sh "$dir"
}
if [ "$MODE" = prepare ]; then prepare "$DATA" 768 768 4; exit; fi

if [ -n "${MMFEED_PYTHON:-}" ]; then
  PY=$MMFEED_PYTHON
elif [ -x .venv/bin/python ]; then
  PY=$PWD/.venv/bin/python
else
  PY=python3
  echo "gpu-check: no virtualenv (.venv/bin/python) here: using this machine's python3 ($(command -v python3 || echo 'not found'))"
fi
command -v "$PY" >/dev/null || { echo "gpu-check: no Python interpreter $PY (set MMFEED_PYTHON)" >&2; exit 1; }
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOGS=${OUT%.json}-logs
rm -rf "$LOGS" && mkdir -p "$LOGS" || { echo "gpu-check: cannot make $LOGS" >&2; exit 1; }
TMP=$(mktemp -d) || exit 1
trap 'rm -rf "$TMP"' EXIT
if [ "$MODE" = dry ]; then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1
  MODEL=tiny BACKEND=aot_eager STEPS="${GPU_CHECK_STEPS:-3}" BATCH="${GPU_CHECK_BATCH:-4}"
  GRIDS=1x1,1x2,2x1,2x2 TEXT=(3 12) EMU_STEPS=2
  echo "gpu-check: dry run on CPU (tiny model, gloo, torch.compile backend $BACKEND)"
else
  MODEL=base BACKEND=inductor STEPS="${GPU_CHECK_STEPS:-20}" BATCH="${GPU_CHECK_BATCH:-128}"
  GRIDS=14x14,16x12,12x16,16x16,10x14 TEXT=(10 77) EMU_STEPS=4
fi
BUDGET="${GPU_CHECK_BUDGET:-300}"
[ "$MODE" = dry ] && BUDGET="${GPU_CHECK_BUDGET:-3600}"  # a loaded CI machine is slow, not a lent GPU
MIN_STAGE="${GPU_CHECK_MIN_STAGE:-20}" RESERVE=15 STAGE_MAX=240  # RESERVE: writing gpu-check.json
left() { echo $(( BUDGET - RESERVE - SECONDS )); }

write_json() {  # gpu-check.json from $LOGS (stdlib only: nothing a stage does not need)
  MODE=$MODE BUDGET=$BUDGET ELAPSED=$SECONDS "$PY" scripts/gpu_check_report.py "$LOGS" "$OUT"
}
declare -A DONE=()  # stage -> ok | failed | stopped

# The environment: interpreter, torch, CUDA, driver, devices (env.json; torch imported once here).
if ! "$PY" scripts/gpu_check_report.py --env "$LOGS/env.json" 2>"$LOGS/env.err"; then
  cat "$LOGS/env.err" >&2
  echo "gpu-check: $PY cannot import torch (see above)" >&2
  write_json; exit 1
fi
NGPU=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["devices"])' "$LOGS/env.json")
if [ "$MODE" = gpu ] && [ "$NGPU" -eq 0 ]; then
  echo "gpu-check: no CUDA device visible (use --dry-run on CPU)" >&2; exit 1
fi

selected() { [ -z "${GPU_CHECK_ONLY:-}" ] || [[ ",$GPU_CHECK_ONLY," == *",$1,"* ]]; }
skip() { printf '%s\t%s\n' "$1" "$2" >>"$LOGS/skipped.tsv"; echo; echo "== $1: skipped ($2)"; }
begin() {  # $1 stage: true when it is to run; otherwise it is recorded under "skipped" with why
  if ! selected "$1"; then skip "$1" "not in GPU_CHECK_ONLY=$GPU_CHECK_ONLY"; return 1; fi
  if [ "$(left)" -lt "$MIN_STAGE" ]; then skip "$1" "over the time budget (${SECONDS} s of ${BUDGET} s spent)"; return 1; fi
}
after() {  # $1 stage, $2 the stage it continues: true when $2 ran ok; else $1 is skipped, saying why
  [ "${DONE[$2]:-}" = ok ] && return 0
  if selected "$1"; then skip "$1" "$2 ${DONE[$2]:-did not run}"; else skip "$1" "not in GPU_CHECK_ONLY=$GPU_CHECK_ONLY"; fi
  return 1
}

# run_stage $1 stage, rest: its command, output to $LOGS/$1.out and .err, at most STAGE_MAX
# seconds and never past the budget. Sets STATUS (ok | failed | stopped), RC, NOTE, T0.
run_stage() {
  local name=$1 limit cap="the ${STAGE_MAX} s stage limit"; shift
  [[ ",${GPU_CHECK_FAIL:-}," == *",$name,"* ]] && set -- "$@" --gpu-check-forced-failure
  limit=$(left)
  if [ "$limit" -gt "$STAGE_MAX" ]; then limit=$STAGE_MAX; else cap="the time budget"; fi
  [ "$limit" -ge 1 ] || limit=1
  T0=$SECONDS RC=0 STATUS=ok NOTE=
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" || RC=$?
  if { [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; } && [ $((SECONDS - T0)) -ge "$limit" ]; then
    STATUS=stopped NOTE="stopped at $cap after ${limit} s (${SECONDS} s of ${BUDGET} s spent)"
  elif [ "$RC" -gt 128 ]; then  # 137 too when it came before the limit: the stage killed itself
    STATUS=failed NOTE="killed by signal $((RC - 128))"
  elif [ "$RC" -ne 0 ]; then
    STATUS=failed NOTE="exit status $RC"
  fi
}
record() {  # $1 stage: its STATUS, RC, seconds and NOTE to $LOGS/stages.tsv, a line here, the log tail on failure
  local name=$1 secs=$((SECONDS - T0))
  DONE[$name]=$STATUS
  [ "$STATUS" = ok ] || rm -f "$LOGS/$name.json"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$STATUS" "$RC" "$secs" "$NOTE" >>"$LOGS/stages.tsv"
  echo "== $name: $STATUS (${secs} s)${NOTE:+: $NOTE}"
  if [ "$STATUS" = failed ]; then tail -20 "$LOGS/$name.err"; fi
}

trainer() {  # $1 stage, $2 processes, rest: flags; the run's JSON summary goes to $LOGS/$1.json;
  # MUST: a text its log must hold (else the stage failed)
  local name=$1 n=$2; shift 2
  begin "$name" || return 0
  echo; echo "== $name: $n process(es), $*"
  if [ "$n" -eq 1 ]; then
    run_stage "$name" "$PY" -m mmfeed_trainer "$@"
  else
    run_stage "$name" "$PY" -m torch.distributed.run --standalone --nproc-per-node "$n" -m mmfeed_trainer "$@"
  fi
  if [ "$STATUS" = ok ]; then
    grep '^{' "$LOGS/$name.out" | tail -1 >"$LOGS/$name.json"
    if [ -s "$LOGS/$name.json" ]; then cat "$LOGS/$name.json"; else STATUS=failed NOTE="no summary line on stdout"; fi
    grep -h 'resumed from\|resized:' "$LOGS/$name.err" | sed 's/^.* INFO /  /'
    if [ -n "${MUST:-}" ] && ! grep -q "$MUST" "$LOGS/$name.err"; then STATUS=failed NOTE="its log lacks '$MUST'"; fi
  fi
  record "$name"
}
synth() {  # the synthetic stream of the throughput stages
  echo --synthetic --model "$MODEL" --warmup 5 --lr 1e-4 --log-every 10 --metrics-skip "$((STEPS / 4))" \
    --synth-samples $((BATCH * 3 / 4)) "$BATCH" --synth-micro-batches 2 --synth-grids "$GRIDS" \
    --synth-text "${TEXT[@]}" --synth-dtype uint8 --synth-distinct 8 --prefetch 3
}

emulate() {  # dp-8 plans (carried, or written here in a dry run), ranks in turn on one device
  local plans=$DATA/plans
  begin emulate || return 0
  if [ "$MODE" = dry ] && [ ! -d "$plans" ] && [ -x bin/mmfeed ]; then
    plans=$TMP/data/plans
    prepare "$TMP/data" 256 128 1 >/dev/null
  fi
  if [ ! -d "$plans" ]; then
    skip emulate "no $plans (scripts/gpu-check.sh --prepare writes it where bin/mmfeed is)"
    return 0
  fi
  echo; echo "== emulate: dp-8 plans of $plans, ranks in turn on one device"
  run_stage emulate "$PY" scripts/gpu_emulate.py --plans "$plans" --model "$MODEL" --steps "$EMU_STEPS" \
    --out "$LOGS/emulate.json"
  if [ "$STATUS" = ok ]; then
    if [ -s "$LOGS/emulate.json" ]; then tail -1 "$LOGS/emulate.out"; else STATUS=failed NOTE="no emulate.json written"; fi
  fi
  record emulate
}

peak=()
if [ -n "${MMFEED_PEAK_TFLOPS:-}" ]; then peak=(--peak-tflops "$MMFEED_PEAK_TFLOPS"); fi
BF16=(--bf16 on)
[ "$MODE" = dry ] && BF16=(--bf16 off)  # CPU bf16 autocast is slow and not what a GPU runs
# shellcheck disable=SC2046
trainer padded 1 $(synth) --steps "$STEPS" "${BF16[@]}" "${peak[@]}"
emulate
# shellcheck disable=SC2046
trainer resume_first 1 $(synth) --steps "$((STEPS / 2))" "${BF16[@]}" --ckpt-dir "$TMP/same"
# shellcheck disable=SC2046
after resume resume_first && MUST='resumed from' trainer resume 1 $(synth) --steps "$STEPS" "${BF16[@]}" --ckpt-dir "$TMP/same" "${peak[@]}"
# shellcheck disable=SC2046
trainer packed 1 $(synth) --steps "$STEPS" --pack "${BF16[@]}" "${peak[@]}"
# shellcheck disable=SC2046
trainer ac_full 1 $(synth) --steps "$STEPS" --ac full "${BF16[@]}" "${peak[@]}"
# shellcheck disable=SC2046
trainer ac_compile 1 $(synth) --steps "$STEPS" --ac selective --compile --compile-backend "$BACKEND" "${BF16[@]}" "${peak[@]}"
small=(--synthetic --model tiny --synth-samples 2 5 --synth-micro-batches 2 --log-every 1 --warmup 1)
CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 trainer elastic_dp2 2 "${small[@]}" --steps 3 --dp 2 --fsdp --ckpt-dir "$TMP/elastic"
after elastic elastic_dp2 &&
  CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=1 MUST='resized: checkpoint dp 2, this run dp 1' trainer elastic 1 "${small[@]}" --steps 6 --dp 1 --allow-resize --ckpt-dir "$TMP/elastic"
if [ "$MODE" = dry ] || [ "$NGPU" -ge 2 ]; then
  n=2; [ "$MODE" = dry ] || n=$NGPU
  # shellcheck disable=SC2046
  trainer mixed_precision "$n" $(synth) --steps "$STEPS" --dp "$n" --fsdp --mixed-precision --cpu-offload --bf16 off "${peak[@]}"
else
  skip mixed_precision "FSDP2 is applied over dp >= 2 only; one GPU cannot hold two NCCL ranks"
fi

write_json || exit 1
failed=()
for k in "${!DONE[@]}"; do [ "${DONE[$k]}" = failed ] && failed+=("$k"); done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "gpu-check: ${#failed[@]} stage(s) failed: ${failed[*]} (their logs: $LOGS)" >&2
  exit 1
fi
