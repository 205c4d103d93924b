"""End to end: the real trainer entry point (torchrun, 2 gloo ranks) against ``bin/mmfeed serve``.

A generated corpus (no broken samples, a multiple of the global batch, so nothing is
quarantined or dropped) is served with a deliberately wrong cost prior (``--cost-scale
1,1000,1``: text 1000x too expensive, so the prior ranks rank-steps by caption length only)
and refit every 2 published steps. The trainer trains the tiny model for one epoch and logs
the ids it consumed (``--log-ids``). Asserted:

* the trainer exits 0 after the epoch;
* every sample of the corpus was consumed exactly once, by one dp rank, in steps 0..n-1;
* feedback reached the service: ``/v1/report`` has a measured time for every (step, rank);
* the service refit its cost model from that feedback, and the refit explains the measured
  rank-step times better than the wrong prior after its best single scale factor
  (``balancer.Calibration.Fit`` against ``.Prior``, on the same observations): a mean relative
  error at least 15% lower and a higher R². Measured here: refit 0.28-0.31, prior 0.45-0.48
  (R² 0.39-0.42 against -0.8 to -1.1). With a milder prior (text 8x) the two errors are alike:
  on 2 shared cores the tiny model's rank-steps are mostly jitter, and the shape of a prior
  that is only moderately wrong hardly matters after scaling.

The service is asked for two epochs so that it is still up (waiting for the second) when
the trainer stops, and the report can be read; the test then stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter

from _dist import free_port
from test_stream import wait_for_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
SAMPLES, GLOBAL_BATCH, DP = 320, 16, 2
STEPS = SAMPLES // GLOBAL_BATCH
LAYOUT = ["--dp", str(DP), "--global-batch", str(GLOBAL_BATCH), "--micro-batches", "2",
          "--resize", "dynamic", "--max-pixels", "65536", "--seed", "11"]


def get_report(http_port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/report", timeout=5) as resp:
            return json.load(resp)
    except OSError:
        return None


def wait_for_plan(http_port: int, serve: subprocess.Popen, deadline_s: float = 60.0) -> dict:
    """The live report once the first epoch is planned (the service answers register then)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            raise RuntimeError(f"mmfeed serve exited with {serve.returncode}")
        report = get_report(http_port)
        if report and (report.get("live") or {}).get("steps_per_epoch"):
            return report
        time.sleep(0.2)
    raise TimeoutError(f"mmfeed serve planned no epoch within {deadline_s} s")


def start_serve(manifest: str, data_dir: str, nats_port: int, http_port: int) -> subprocess.Popen:
    cmd = [BIN, "serve", "--input", manifest, *LAYOUT, "--job", "e2etrain", "--data-dir", data_dir,
           "--epochs", "2", "--cost-scale", "1,1000,1", "--recalibrate", "2",
           # a small stream keeps the service a few steps ahead of the trainer, so refits
           # happen while feedback arrives (not after everything was published)
           "--stream-max-bytes", "16000000", "--ack-wait", "30s",
           "--nats-listen", f"127.0.0.1:{nats_port}", "--http", f"127.0.0.1:{http_port}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_trainer(nats_port: int, ids_dir: str, steps: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP),
           "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{nats_port}", "--job", "e2etrain",
           "--dp", str(DP), "--mp", "1", "--model", "tiny", "--steps", str(steps), "--warmup", "2",
           "--log-every", "5", "--log-ids", ids_dir]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)


def consumed(ids_dir: str) -> list[dict]:
    rows = []
    for name in sorted(os.listdir(ids_dir)):
        with open(os.path.join(ids_dir, name), encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f)
    return rows



def stop_serve(serve: subprocess.Popen) -> None:
    """SIGTERM a running ``mmfeed serve``, killing it after 30 s."""
    if serve.poll() is None:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()


def check_epoch_once(ids_dir: str, corpus: list, dp: int, steps: int) -> None:
    """From the ``--log-ids`` rows of epoch 0: every dp rank trained steps 0..steps-1 and every
    corpus id was consumed exactly once."""
    rows = [r for r in consumed(ids_dir) if r["epoch"] == 0]
    for rank in range(dp):
        assert [r["step"] for r in rows if r["dp_rank"] == rank] == list(range(steps)), f"dp rank {rank} steps"
    got = Counter(i for r in rows for mb in r["ids"] for i in mb)
    assert sorted(got) == sorted(corpus), "consumed ids differ from the corpus"
    assert max(got.values()) == 1, f"consumed twice: {[i for i, n in got.items() if n > 1]}"

def test_trainer_trains_an_epoch_from_serve(mmfeed, tmp_path):
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "4"],
                   check=True, capture_output=True, text=True, timeout=120)
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    corpus = [json.loads(line)["id"] for line in open(manifest, encoding="utf-8")]
    nats_port, http_port = free_port(), free_port()
    serve = start_serve(manifest, str(tmp_path / "serve"), nats_port, http_port)
    try:
        wait_for_port(nats_port, deadline_s=60)
        planned = wait_for_plan(http_port, serve)["live"]["steps_per_epoch"]
        assert planned == STEPS, f"the service planned {planned} steps, want {STEPS} (nothing dropped)"
        trained = run_trainer(nats_port, str(tmp_path / "ids"), STEPS)
        assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-6000:]
        report = get_report(http_port)
        assert report is not None, "the service stopped before the report was read"
    finally:
        stop_serve(serve)
    check_epoch_once(str(tmp_path / "ids"), corpus, DP, STEPS)

    live = report["live"]
    steps = {s["step"]: s for s in live["steps"] if s["epoch"] == 0}
    assert sorted(steps) == list(range(STEPS))
    missing = [(k, r) for k, s in steps.items() for r, sec in enumerate(s["measured_seconds"]) if not sec > 0]
    assert not missing, f"(step, dp rank) without a measured time: {missing}"

    cal = live["calibration"]
    assert cal is not None, f"no calibration from {live['observations']} observations"
    assert cal["fit"]["n"] >= 16
    fit, prior = cal["fit"], cal["prior"]
    assert fit["mean_rel_err"] < 0.85 * prior["mean_rel_err"] and fit["r2"] > prior["r2"], (
        f"refit R² {fit['r2']:.3f} (mean relative error {fit['mean_rel_err']:.3f}) not above the prior's "
        f"{prior['r2']:.3f} ({prior['mean_rel_err']:.3f}) on {fit['n']} observations")
