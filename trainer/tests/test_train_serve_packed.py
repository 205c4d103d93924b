"""End to end with packed micro-batches: ``bin/mmfeed serve --pack`` (dynamic resolution)
and the real trainer entry point (torchrun, 2 gloo ranks).

* a trainer without ``--pack`` is refused before it consumes anything: the register reply
  says the plan is packed, and the trainer exits non-zero naming ``--pack``;
* with ``--pack`` it trains the epoch: every sample consumed exactly once, by one dp rank,
  in steps 0..n-1, with packed micro-batches (the batches' ``mmfeed.pack`` metadata is
  checked on every record).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _dist import free_port
from test_stream import wait_for_port
from test_train_serve import BIN, REPO, check_epoch_once, stop_serve, wait_for_plan

SAMPLES, GLOBAL_BATCH, DP = 96, 16, 2
STEPS = SAMPLES // GLOBAL_BATCH


def start_serve(manifest: str, data_dir: str, nats_port: int, http_port: int) -> subprocess.Popen:
    cmd = [BIN, "serve", "--input", manifest, "--dp", str(DP), "--global-batch", str(GLOBAL_BATCH),
           "--micro-batches", "2", "--resize", "dynamic", "--max-pixels", "65536", "--seed", "11",
           "--pack", "--mb-max-tokens", "4096", "--job", "packed", "--data-dir", data_dir, "--epochs", "2",
           "--ack-wait", "30s", "--nats-listen", f"127.0.0.1:{nats_port}", "--http", f"127.0.0.1:{http_port}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_trainer(nats_port: int, ids_dir: str, pack: bool) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP),
           "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{nats_port}", "--job", "packed",
           "--dp", str(DP), "--mp", "1", "--model", "tiny", "--steps", str(STEPS), "--warmup", "2",
           "--log-every", "5", "--log-ids", ids_dir, *(["--pack"] if pack else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


def test_packed_trainer_trains_an_epoch_from_serve_pack(mmfeed, tmp_path):
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "5"],
                   check=True, capture_output=True, text=True, timeout=120)
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    corpus = [json.loads(line)["id"] for line in open(manifest, encoding="utf-8")]
    nats_port, http_port = free_port(), free_port()
    serve = start_serve(manifest, str(tmp_path / "serve"), nats_port, http_port)
    try:
        wait_for_port(nats_port, deadline_s=60)
        assert wait_for_plan(http_port, serve)["live"]["steps_per_epoch"] == STEPS
        refused = run_trainer(nats_port, str(tmp_path / "ids-padded"), pack=False)
        assert refused.returncode != 0
        assert "planned packed micro-batches" in refused.stderr + refused.stdout, refused.stderr[-3000:]
        trained = run_trainer(nats_port, str(tmp_path / "ids"), pack=True)
        assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-6000:]
    finally:
        stop_serve(serve)
    check_epoch_once(str(tmp_path / "ids"), corpus, DP, STEPS)
