#!/usr/bin/env bash
# GPU check of the bundled trainer (CI never needs it; run it by hand on a CUDA machine).
#
#   1. NCCL smoke + throughput: the base model (ViT-B/16 + BERT-base + 6 fusion layers),
#      bf16 autocast, on synthetic-but-realistic batches (dynamic resolution around 224 px,
#      captions of 10-77 tokens, uint8 pixels normalised on the GPU, 2 micro-batches per
#      step), one process per GPU, DDP over dp = #GPUs. Prints step time, samples/s, MFU
#      and the data-wait fraction (JSON summary on the last line).
#   2. Memory and speed options on the same run: selective activation checkpointing per
#      block and torch.compile per block (--ac selective --compile; compare its samples/s
#      and MFU with stage 1).
#   3. With >= 2 GPUs: FSDP2 with the bf16 MixedPrecisionPolicy (fp32 reduce) and full AC,
#      modality-parallel (mp = 2) when the GPU count is even, so the NCCL feature exchange
#      runs too (no MFU there: a modality rank does not see the other modality's token
#      counts).
#   4. The parity tests (CPU/gloo; DDP and FSDP2) so a GPU box also proves exactness.
#
# Bounded: every stage runs under `timeout`; the whole script stays under 5 minutes.
# Env: MMFEED_PYTHON (default .venv/bin/python), GPU_CHECK_STEPS (default 30),
#      GPU_CHECK_BATCH (samples per rank and micro-batch, default 64), MMFEED_PEAK_TFLOPS,
#      GPU_CHECK_CPU=N: a dry run of stages 1-3 on N CPU processes (gloo) with the tiny
#      model (torch.compile with the eager backend: tracing without a C++ build), so CI
#      checks that every command of this script still runs (trainer/tests/test_gpu_check.py);
#      stage 4 is skipped there (make test runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${MMFEED_PYTHON:-$PWD/.venv/bin/python}"
STEPS="${GPU_CHECK_STEPS:-30}"
BATCH="${GPU_CHECK_BATCH:-64}"
export PYTHONPATH="$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

MODEL=base BACKEND=inductor
if [ -n "${GPU_CHECK_CPU:-}" ]; then
  ngpu=$GPU_CHECK_CPU MODEL=tiny BACKEND=eager
  export OMP_NUM_THREADS=1
  echo "gpu-check: CPU dry run on $ngpu processes (tiny model, gloo)"
else
  ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
fi
if [ "$ngpu" -eq 0 ]; then
  echo "gpu-check: no CUDA device visible; nothing to check (CI covers the CPU paths)"
  exit 0
fi
[ -n "${GPU_CHECK_CPU:-}" ] || "$PY" -c 'import torch; print("gpu-check:", torch.cuda.device_count(), "x", torch.cuda.get_device_name(0), "torch", torch.__version__)'

peak=()
if [ -n "${MMFEED_PEAK_TFLOPS:-}" ]; then peak=(--peak-tflops "$MMFEED_PEAK_TFLOPS"); fi

train() {  # $1 label, $2 dp, $3 mp, rest: extra flags
  local label=$1 dp=$2 mp=$3; shift 3
  echo; echo "== $label: $MODEL model, bf16, NCCL, dp $dp x mp $mp, $STEPS steps, $BATCH samples/rank/micro-batch"
  timeout 150 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$ngpu" -m mmfeed_trainer \
    --synthetic --model "$MODEL" --bf16 on --dp "$dp" --mp "$mp" --steps "$STEPS" --warmup 5 --lr 1e-4 \
    --log-every 10 --metrics-skip 5 --synth-samples $((BATCH - 8)) "$BATCH" --synth-micro-batches 2 \
    --synth-grids 14x14,16x12,12x16,16x16,10x14 --synth-text 10 77 --synth-dtype uint8 --synth-distinct 8 --prefetch 3 \
    "${peak[@]}" "$@"
}

train "DDP" "$ngpu" 1
train "DDP + AC selective + compile" "$ngpu" 1 --ac selective --compile --compile-backend "$BACKEND"
if [ "$ngpu" -gt 1 ]; then
  mem=(--fsdp --mixed-precision --bf16 off --ac full)  # the policy alone, no autocast on top
  if [ $((ngpu % 2)) -eq 0 ] && [ "$ngpu" -gt 2 ]; then
    train "FSDP2 bf16 policy + AC full + modality parallel" $((ngpu / 2)) 2 "${mem[@]}"
  elif [ $((ngpu % 2)) -eq 0 ]; then
    train "modality parallel" 1 2
    train "FSDP2 bf16 policy + AC full" "$ngpu" 1 "${mem[@]}"
  else
    train "FSDP2 bf16 policy + AC full" "$ngpu" 1 "${mem[@]}"
  fi
fi

if [ -n "${GPU_CHECK_CPU:-}" ]; then exit 0; fi
echo; echo "== parity tests (dp x mp on CPU/gloo vs one process; DDP and FSDP2)"
timeout 120 "$PY" -m pytest -q trainer/tests/test_parity.py
