"""End to end under pipeline parallelism: ``torchrun`` dp 1 x pp 2 (gloo) against
``bin/mmfeed serve --pp 2``. Only stage 0 registers (with pp in its layout) and receives
data; the epoch is trained exactly once; a trainer whose pp differs from the job's is
refused with a clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.data.stream import StreamError, StreamSource

from _dist import free_port
from test_stream import wait_for_port
from test_train_serve import BIN, REPO, check_epoch_once, stop_serve, wait_for_plan

SAMPLES, GLOBAL_BATCH = 96, 16
STEPS = SAMPLES // GLOBAL_BATCH


def _serve(manifest: str, data_dir: str, nats_port: int, http_port: int) -> subprocess.Popen:
    cmd = [BIN, "serve", "--input", manifest, "--dp", "1", "--pp", "2", "--global-batch", str(GLOBAL_BATCH),
           "--micro-batches", "3", "--resize", "dynamic", "--max-pixels", "65536", "--seed", "5",
           "--job", "pipe", "--data-dir", data_dir, "--epochs", "2",
           "--nats-listen", f"127.0.0.1:{nats_port}", "--http", f"127.0.0.1:{http_port}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _train(nats_port: int, ids_dir: str, pp: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(pp),
           "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{nats_port}", "--job", "pipe", "--dp", "1",
           "--pp", str(pp), "--model", "tiny", "--steps", str(STEPS), "--warmup", "2", "--log-every", "3",
           "--log-ids", ids_dir]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


def test_pipeline_trainer_trains_an_epoch_from_serve(mmfeed, tmp_path):
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "4"],
                   check=True, capture_output=True, text=True, timeout=120)
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    corpus = [json.loads(line)["id"] for line in open(manifest, encoding="utf-8")]
    nats_port, http_port = free_port(), free_port()
    serve = _serve(manifest, str(tmp_path / "serve"), nats_port, http_port)
    try:
        wait_for_port(nats_port, deadline_s=60)
        assert wait_for_plan(http_port, serve)["live"]["steps_per_epoch"] == STEPS
        unpipelined = StreamSource(url=f"nats://127.0.0.1:{nats_port}", job="pipe", dims=ParallelDims())
        try:
            with pytest.raises(StreamError, match="does not match the job's pp=2"):
                unpipelined.register({"epoch": 0, "next_step": 0})
        finally:
            unpipelined.close()
        trained = _train(nats_port, str(tmp_path / "ids"), 2)
        assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-6000:]
    finally:
        stop_serve(serve)
    assert os.listdir(tmp_path / "ids") == ["ids-rank000.jsonl"], "only stage 0 (global rank 0) receives data"
    check_epoch_once(str(tmp_path / "ids"), corpus, 1, STEPS)
