"""Soak: ``kill -9`` the real trainer (torchrun, 2 gloo ranks) and ``bin/mmfeed serve``, again and
again, until every epoch is trained; every sample of every epoch is then consumed exactly once,
counting from the checkpoints.

The trainer checkpoints every step (``--ckpt-dir``) and logs the ids of each step it consumes
(``--log-ids``). A killed trainer is started again with the same command: it resumes from its
latest checkpoint and registers there, so the steps after that checkpoint are consumed again —
with the same ids (the plan is deterministic and stored). A killed service is started again on
the same data dir and ports; the trainers reconnect. Asserted, per epoch: each dp rank's steps
are 0..n-1, every replay of a (epoch, rank, step) holds the same ids, and the ids of the epoch
are the corpus, each once. The RSS of the service is sampled and stays under ``RSS_BOUND``.

``make test`` runs the short version (one kill of each, 2 epochs of 4 steps); ``make soak`` runs
``MMFEED_SOAK_SECONDS`` (default there 600) of kills over ``MMFEED_SOAK_EPOCHS`` epochs;
``MMFEED_SOAK_DATA_PLANE=jetstream`` soaks the JetStream data plane.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict

from _dist import free_port
from test_stream import wait_for_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
SOAK_S = float(os.environ.get("MMFEED_SOAK_SECONDS", "0"))
EPOCHS = int(os.environ.get("MMFEED_SOAK_EPOCHS", "2"))
SAMPLES, GLOBAL_BATCH, DP = 64, 16, 2
STEPS = SAMPLES // GLOBAL_BATCH
PLANE = os.environ.get("MMFEED_SOAK_DATA_PLANE", "core")
RSS_BOUND = 1536 << 20
"""Bound on the service's RSS (its stream or outbox is bounded by --stream-max-bytes, 1 GiB
by default, but the soak's corpus is small: measured 186 MiB on the short run)."""
RANK_RSS_BOUND = 3 << 30
"""Bound on each trainer rank's RSS (the tiny model on CPU)."""
LAYOUT = ["--dp", str(DP), "--global-batch", str(GLOBAL_BATCH), "--micro-batches", "2",
          "--resize", "dynamic", "--max-pixels", "16384", "--seed", "3"]


def start_serve(manifest, data_dir, nats_port):
    cmd = [BIN, "serve", "--input", manifest, *LAYOUT, "--job", "soak", "--data-dir", data_dir,
           "--epochs", str(EPOCHS), "--recalibrate", "-1", "--data-plane", PLANE, "--nats-listen", f"127.0.0.1:{nats_port}", "--http", ""]
    log = open(os.path.join(data_dir + ".log"), "a")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def start_trainer(nats_port, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP),
           "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{nats_port}", "--job", "soak",
           "--dp", str(DP), "--mp", "1", "--model", "tiny", "--steps", "1000000", "--warmup", "2",
           "--log-every", "50", "--log-ids", str(tmp_path / "ids"), "--ckpt-dir", str(tmp_path / "ckpt"),
           "--ckpt-every", "1"]
    log = open(tmp_path / "trainer.log", "a")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each rank in a session of its own, so
    killing torchrun's process group leaves the ranks running)."""
    children = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children[todo.pop()]:
            out.append(c)
            todo.append(c)
    return out


def kill9(p: subprocess.Popen) -> None:
    """SIGKILL the process and everything below it (torchrun and its ranks, or the service),
    and wait until they are gone."""
    pids = descendants(p.pid)
    for pid in [p.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") and not zombie(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {pids} survived SIGKILL")
        time.sleep(0.05)


def zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def rows(ids_dir) -> list[dict]:
    out = []
    if os.path.isdir(ids_dir):
        for name in sorted(os.listdir(ids_dir)):
            with open(os.path.join(ids_dir, name), encoding="utf-8") as f:
                out.extend(json.loads(line) for line in f if line.endswith("\n"))
    return out


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def wait_progress(tmp_path, trainer, after: int, deadline: float) -> bool:
    """Wait until the trainers logged more than ``after`` steps; False when the trainer ended."""
    while time.monotonic() < deadline:
        if trainer.poll() is not None:
            return False
        if len(rows(tmp_path / "ids")) > after:
            return True
        time.sleep(0.2)
    raise TimeoutError(f"no trainer progress past {after} logged steps")


def test_soak_kill9_trainer_and_serve(mmfeed, tmp_path):
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "4"],
                   check=True, capture_output=True, timeout=120)
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    corpus = sorted(json.loads(line)["id"] for line in open(manifest, encoding="utf-8"))
    data_dir, nats_port = str(tmp_path / "serve"), free_port()
    serve = start_serve(manifest, data_dir, nats_port)
    trainer = None
    kills, peak, rank_peak = Counter(), 0, 0
    rng = random.Random(7)
    try:
        wait_for_port(nats_port, deadline_s=60)
        trainer = start_trainer(nats_port, tmp_path)
        end = time.monotonic() + SOAK_S
        plan = ["trainer", "serve"]  # the short version: one of each
        while trainer.poll() is None:
            target = plan.pop(0) if plan else (rng.choice(["trainer", "serve"]) if time.monotonic() < end else None)
            if target is None:
                break
            if not wait_progress(tmp_path, trainer, len(rows(tmp_path / "ids")) + rng.randint(0, 3),
                                 time.monotonic() + 300):
                break
            peak = max(peak, rss(serve.pid))
            rank_peak = max([rank_peak] + [rss(pid) for pid in descendants(trainer.pid)])
            if target == "trainer":
                kill9(trainer)
                trainer = start_trainer(nats_port, tmp_path)
            else:
                kill9(serve)
                serve = start_serve(manifest, data_dir, nats_port)
            kills[target] += 1
        while trainer.poll() is None:
            peak = max(peak, rss(serve.pid))
            rank_peak = max([rank_peak] + [rss(pid) for pid in descendants(trainer.pid)])
            time.sleep(0.5)
        assert trainer.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
        assert serve.wait(timeout=60) == 0, open(data_dir + ".log").read()[-4000:]
    finally:
        for p in (trainer, serve):
            if p is not None and p.poll() is None:
                kill9(p)
    print(f"soak: {dict(kills)} kills over {EPOCHS} epochs ({PLANE} data plane), peak RSS: service "
          f"{peak >> 20} MiB, trainer rank {rank_peak >> 20} MiB")
    assert kills["trainer"] >= 1 and kills["serve"] >= 1, f"kills {dict(kills)}: the run ended before the faults"
    assert 0 < peak < RSS_BOUND, f"service RSS {peak >> 20} MiB"
    assert 0 < rank_peak < RANK_RSS_BOUND, f"trainer rank RSS {rank_peak >> 20} MiB"

    steps = defaultdict(list)  # (epoch, dp rank, step) -> ids of each time it was consumed
    for r in rows(tmp_path / "ids"):
        steps[(r["epoch"], r["dp_rank"], r["step"])].append(r["ids"])
    for key, copies in steps.items():
        assert all(c == copies[0] for c in copies), f"{key} replayed with other ids"
    for epoch in range(EPOCHS):
        for rank in range(DP):
            got = sorted(s for e, r, s in steps if e == epoch and r == rank)
            assert got == list(range(STEPS)), f"epoch {epoch} dp rank {rank}: steps {got}"
        ids = Counter(i for (e, _, _), copies in steps.items() if e == epoch for mb in copies[0] for i in mb)
        assert sorted(ids) == corpus, f"epoch {epoch}: consumed ids differ from the corpus"
        assert max(ids.values()) == 1, f"epoch {epoch}: consumed twice: {[i for i, n in ids.items() if n > 1]}"
