"""Soak: the real trainer (torchrun, 2 gloo ranks) against ``bin/mmfeed serve`` while the test
injects faults, until every epoch is trained; every sample of every epoch is then consumed
exactly once (or quarantined), counting from the checkpoints.

Two variants:

- ``all``: one ``serve --role all`` process.
- ``planner``: ``serve --role planner`` (the embedded NATS server, the plan) and two
  ``serve --role worker`` processes that preprocess every item.

Faults: ``trainer`` kills -9 torchrun and its ranks (a crash; started again with the same command,
it resumes from its latest checkpoint), ``serve`` kills -9 the service (or the planner) and starts
it again on the same data dir and ports, ``worker`` kills -9 a worker and starts another one
(once per run), ``disconnect`` cuts every trainer connection (the trainers reach NATS through a
TCP relay of the test, ``Relay``; they reconnect), ``pause`` stops one rank or both with SIGSTOP
for a few seconds. The trainer checkpoints every step (``--ckpt-dir``) and logs the live ids of
each step it consumes (``--log-ids``); a crash replays the steps after its checkpoint, with the
same ids (the plan is deterministic and stored).

Asserted at the end:

- per epoch: each dp rank's steps are 0..n-1, every replay of a (epoch, rank, step) holds the same
  ids, and the live ids of the epoch are the corpus less the quarantined samples, each once;
- the RSS of every process (the service, each worker, torchrun and each trainer rank), sampled
  every ``RSS_EVERY_S`` by a thread, stays under its bound (``RSS_BOUNDS``);
- no goroutine growth: the service's ``go_goroutines`` (its ``/metrics``), at a quiet point after
  the last service restart (the trainers paused) and again after the load (the trainers gone,
  the service idle on an epoch nobody consumes), grows by at most ``GOROUTINE_SLACK``.

``make test`` runs the short versions (a fixed list of faults each, see ``SHORT_FAULTS``);
``make soak`` runs ``MMFEED_SOAK_SECONDS`` (default there 600; fewer when 2/3 of the steps are
trained first) of random faults over
``MMFEED_SOAK_EPOCHS`` epochs; ``MMFEED_SOAK_ROLE`` (all, planner) selects one variant and
``MMFEED_SOAK_DATA_PLANE=jetstream`` soaks the JetStream data plane.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict

import pytest

from _dist import free_ports
from test_stream import wait_for_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
SOAK_S = float(os.environ.get("MMFEED_SOAK_SECONDS", "0"))
EPOCHS = int(os.environ.get("MMFEED_SOAK_EPOCHS", "0"))
"""Epochs trained (0: the short version's, per variant); the service plans one more that nobody
consumes, so it is still running, idle, when the trainers end (the goroutine check)."""
SAMPLES, GLOBAL_BATCH, DP = 64, 16, 2
STEPS = SAMPLES // GLOBAL_BATCH
PLANE = os.environ.get("MMFEED_SOAK_DATA_PLANE", "core")
ROLES = [r for r in os.environ.get("MMFEED_SOAK_ROLE", "all,planner").split(",") if r]
SHORT_FAULTS = {
    "all": ["trainer", "serve"],
    "planner": ["serve", "worker", "quiet", "disconnect", "pause", "disconnect"],
}
"""The short version's faults, in order; ``quiet`` is the goroutine baseline (after the last
``serve``; the short ``all`` run, kept within ``make test``'s time, has none: the planner's covers
the check). The long version draws faults at random for MMFEED_SOAK_SECONDS, then injects
``LONG_TAIL``."""
LONG_TAIL = ["quiet", "disconnect", "pause", "trainer", "disconnect"]
"""The long version's last faults: the goroutine baseline, then the load the check covers."""
SHORT_EPOCHS = {"all": 2, "planner": 2}
RSS_BOUNDS = {"service": 1536 << 20, "worker": 1024 << 20, "trainer": 3 << 30}
"""Bounds on each process's RSS: the service holds at most --stream-max-bytes (1 GiB by default)
of batches, but the soak's corpus is small (measured peaks are printed and in
docs/reliability.md); a worker holds the items it preprocesses (one slot); a trainer rank is the
tiny model on CPU (torchrun's agent is counted as a trainer process too)."""
RSS_EVERY_S = 0.5
GOROUTINE_SLACK = 16
"""Goroutines the service may have more after the load than at the baseline: timers, a fetch or
ack handler in flight (a leak grows with every register, resend, reconnect and restart of the
load instead)."""
LAYOUT = ["--dp", str(DP), "--global-batch", str(GLOBAL_BATCH), "--micro-batches", "2",
          "--resize", "dynamic", "--max-pixels", "16384", "--seed", "3", "--tail", "pad"]


class Relay:
    """A TCP relay from a port of its own to the service's NATS port: the trainers connect
    through it, and ``cut`` closes every connection it carries (a network fault: the trainers
    see their connection drop and reconnect; the server sees it close)."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:  # the service is down: the client tries again
                client.close()
                continue
            with self.lock:
                self.conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self.lock:
            self.conns.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def cut(self) -> int:
        """Close every relayed connection; returns how many there were (client and server side)."""
        with self.lock:
            conns = list(self.conns)
        for s in conns:
            self._drop(s)
        return len(conns)

    def close(self) -> None:
        self.sock.close()
        self.cut()


class RSSSampler:
    """Samples the RSS of every process of the run every RSS_EVERY_S on a thread; ``peaks`` are
    per kind (service, worker, trainer) and ``samples`` counts the readings."""

    def __init__(self, procs):
        self.procs = procs  # () -> [(kind, pid)]
        self.peaks: Counter = Counter()
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(RSS_EVERY_S):
            for kind, pid in self.procs():
                if (r := rss(pid)) > 0:
                    self.peaks[kind] = max(self.peaks[kind], r)
                    self.samples += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class Run:
    """The processes of one soak: the service (and workers), the trainer, the relay."""

    def __init__(self, role: str, tmp_path, epochs: int):
        self.role, self.tmp, self.epochs = role, tmp_path, epochs
        self.manifest = str(tmp_path / "corpus" / "manifest.jsonl")
        self.data_dir = str(tmp_path / "serve")
        self.nats_port, self.http_port = free_ports(2)
        self.url = f"nats://127.0.0.1:{self.nats_port}"
        self.relay = Relay(self.nats_port)
        self.serve = self.trainer = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()

    def start_serve(self) -> None:
        role = ["--role", "planner", "--work-ack-wait", "500ms"] if self.role == "planner" else []
        cmd = [BIN, "serve", *role, "--input", self.manifest, *LAYOUT, "--job", "soak", "--data-dir", self.data_dir,
               "--epochs", str(self.epochs + 1), "--recalibrate", "-1", "--data-plane", PLANE,
               "--nats-listen", f"127.0.0.1:{self.nats_port}", "--http", f"127.0.0.1:{self.http_port}"]
        with self.lock:
            self.serve = subprocess.Popen(cmd, stdout=open(self.data_dir + ".log", "a"), stderr=subprocess.STDOUT,
                                          start_new_session=True)
        wait_for_port(self.nats_port, deadline_s=60, proc=self.serve)

    def start_worker(self, name: str) -> None:
        cmd = [BIN, "serve", "--role", "worker", "--nats", self.url, "--slots", "1"]
        with self.lock:
            self.workers[name] = subprocess.Popen(cmd, stdout=open(self.tmp / f"worker-{name}.log", "a"),
                                                  stderr=subprocess.STDOUT, start_new_session=True)

    def start_trainer(self) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(DP),
               "-m", "mmfeed_trainer", "--nats", f"nats://127.0.0.1:{self.relay.port}", "--job", "soak",
               "--dp", str(DP), "--mp", "1", "--model", "tiny", "--steps", str(self.epochs * STEPS), "--warmup", "2",
               "--log-every", "50", "--log-ids", str(self.tmp / "ids"), "--ckpt-dir", str(self.tmp / "ckpt"),
               "--ckpt-every", "1"]
        with self.lock:
            self.trainer = subprocess.Popen(cmd, stdout=open(self.tmp / "trainer.log", "a"), stderr=subprocess.STDOUT,
                                            cwd=REPO, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    def processes(self) -> list[tuple[str, int]]:
        with self.lock:
            out = [("service", self.serve.pid)] if self.serve else []
            out += [("worker", w.pid) for w in self.workers.values() if w.poll() is None]
            if self.trainer is not None:
                out += [("trainer", pid) for pid in [self.trainer.pid, *descendants(self.trainer.pid)]]
        return out

    def ranks(self) -> list[int]:
        """The trainer's rank processes (torchrun's children)."""
        return [pid for pid in descendants(self.trainer.pid) if ppid(pid) == self.trainer.pid]

    def goroutines(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
                m = re.search(r"^go_goroutines (\d+)", r.read().decode(), re.M)
        except OSError:
            return None
        return int(m.group(1)) if m else None

    def quiet_goroutines(self, window_s: float = 2.5) -> int:
        """The fewest goroutines the service reports over window_s (transients pass)."""
        seen, deadline = [], time.monotonic() + 60
        end = time.monotonic() + window_s
        while time.monotonic() < end or not seen:
            assert time.monotonic() < deadline, "no go_goroutines on the service's /metrics"
            if (n := self.goroutines()) is not None:
                seen.append(n)
            time.sleep(0.25)
        return min(seen)

    def stop_all(self) -> None:
        for p in (self.trainer, self.serve, *self.workers.values()):
            if p is not None and p.poll() is None:
                kill9(p)
        self.relay.close()


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each rank in a session of its own, so
    killing torchrun's process group leaves the ranks running)."""
    children = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (parent := ppid(int(entry))) is not None:
            children[parent].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children[todo.pop()]:
            out.append(c)
            todo.append(c)
    return out


def ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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


def pause(pids: list[int], seconds: float) -> None:
    """SIGSTOP pids for seconds, then SIGCONT them."""
    for sig in (signal.SIGSTOP, signal.SIGCONT):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGSTOP:
            time.sleep(seconds)


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


def wait_progress(run: Run, after: int, deadline: float) -> bool:
    """Wait until the trainers logged more than ``after`` steps; False when the trainer ended."""
    while time.monotonic() < deadline:
        if run.trainer.poll() is not None:
            return False
        if len(rows(run.tmp / "ids")) > after:
            return True
        time.sleep(0.2)
    raise TimeoutError(f"no trainer progress past {after} logged steps")


def faults(role: str, rng: random.Random, trained):
    """The faults to inject, in order (a generator: the long version's draws end with its time,
    or once ``trained()``, the share of the steps trained, passes 2/3, leaving steps for the load
    after the goroutine baseline)."""
    if SOAK_S <= 0:
        yield from SHORT_FAULTS[role]
        return
    kinds = ["trainer", "serve", "disconnect", "pause"]
    end = time.monotonic() + SOAK_S
    worker_at = end - SOAK_S / 2  # the one worker kill, half way
    while time.monotonic() < end and trained() < 2 / 3:
        if role == "planner" and worker_at is not None and time.monotonic() > worker_at:
            worker_at = None
            yield "worker"
        yield rng.choice(kinds)
    yield from LONG_TAIL


def quarantined_ids(tmp_path) -> set[str]:
    """The corpus's broken samples, as `mmfeed shard` (another path than serve) quarantines them."""
    out = tmp_path / "shards"
    subprocess.run([BIN, "shard", "--input", str(tmp_path / "corpus" / "manifest.jsonl"), *LAYOUT, "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return {json.loads(line)["id"] for line in open(out / "quarantine.jsonl", encoding="utf-8")}


@pytest.mark.parametrize("role", ["all", "planner"])
def test_soak(mmfeed, tmp_path, role):
    if role not in ROLES:
        pytest.skip(f"MMFEED_SOAK_ROLE={','.join(ROLES)}")
    epochs = EPOCHS or SHORT_EPOCHS[role]
    subprocess.run([BIN, "synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "4",
                    "--bad-fraction", "0.05"], check=True, capture_output=True, timeout=120)
    quarantined = quarantined_ids(tmp_path)
    run = Run(role, tmp_path, epochs)
    injected, rng = Counter(), random.Random(7)
    sampler = RSSSampler(run.processes)
    before = after = None
    try:
        run.start_serve()
        if role == "planner":
            run.start_worker("a")
            run.start_worker("b")
        run.start_trainer()
        worker_names = iter("cdefgh")
        trained = lambda: len({(r["epoch"], r["dp_rank"], r["step"]) for r in rows(tmp_path / "ids")}) / (epochs * STEPS * DP)
        for fault in faults(role, rng, trained):
            if not wait_progress(run, len(rows(tmp_path / "ids")) + (0 if SOAK_S <= 0 else rng.randint(0, 3)),
                                 time.monotonic() + 300):
                break
            if fault == "trainer":
                kill9(run.trainer)
                run.start_trainer()
            elif fault == "serve":
                kill9(run.serve)
                run.start_serve()
            elif fault == "worker":
                kill9(run.workers.pop("a"))
                run.start_worker(next(worker_names))
            elif fault == "disconnect":
                assert run.relay.cut() > 0, "no trainer connection to cut"
            elif fault == "pause":
                ranks = run.ranks()
                pause(rng.sample(ranks, rng.randint(1, len(ranks))), 1 if SOAK_S <= 0 else rng.uniform(1, 4))
            elif fault == "quiet":  # the trainers paused, the service idle: the baseline
                ranks = run.ranks()
                for pid in ranks:
                    os.kill(pid, signal.SIGSTOP)
                try:
                    before = run.quiet_goroutines()
                finally:
                    for pid in ranks:
                        os.kill(pid, signal.SIGCONT)
            injected[fault] += 1
        assert run.trainer.wait(timeout=600) == 0, (tmp_path / "trainer.log").read_text()[-4000:]
        assert run.serve.poll() is None, open(run.data_dir + ".log").read()[-4000:]
        after = run.quiet_goroutines()  # the trainers gone; the service waits for the extra epoch's ranks
        run.serve.send_signal(signal.SIGTERM)
        assert run.serve.wait(timeout=60) == 0, open(run.data_dir + ".log").read()[-4000:]
        for w in run.workers.values():
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=60) == 0
    finally:
        sampler.close()
        run.stop_all()
    peaks = {k: v >> 20 for k, v in sampler.peaks.items()}
    print(f"soak ({role}): faults {dict(injected)} over {epochs} epochs ({PLANE} data plane); peak RSS MiB {peaks} "
          f"({sampler.samples} samples); service goroutines {before} at the baseline, {after} after the load; "
          f"{len(quarantined)} samples quarantined")
    short = SHORT_FAULTS[role]
    missing = set(short) - set(injected) if SOAK_S <= 0 else {"quiet"} - set(injected)
    assert not missing, f"faults {dict(injected)}: the run ended before {missing}"
    for kind, bound in RSS_BOUNDS.items():
        if kind != "worker" or role == "planner":
            assert 0 < sampler.peaks[kind] < bound, f"{kind} RSS {sampler.peaks[kind] >> 20} MiB (bound {bound >> 20})"
    if "quiet" in injected:
        assert after <= before + GOROUTINE_SLACK, f"service goroutines grew from {before} to {after}"

    steps = defaultdict(list)  # (epoch, dp rank, step) -> ids of each time it was consumed
    for r in rows(tmp_path / "ids"):
        steps[(r["epoch"], r["dp_rank"], r["step"])].append(r["ids"])
    for key, copies in steps.items():
        assert all(c == copies[0] for c in copies), f"{key} replayed with other ids"
    corpus = sorted(json.loads(line)["id"] for line in open(run.manifest, encoding="utf-8"))
    live = sorted(set(corpus) - quarantined)
    assert quarantined and len(live) > SAMPLES // 2, f"{len(quarantined)} quarantined"
    assert {e for e, _, _ in steps} == set(range(epochs)), "trained epochs"
    for epoch in range(epochs):
        for rank in range(DP):
            got = sorted(s for e, r, s in steps if e == epoch and r == rank)
            assert got == list(range(STEPS)), f"epoch {epoch} dp rank {rank}: steps {got}"
        ids = Counter(i for (e, _, _), copies in steps.items() if e == epoch for mb in copies[0] for i in mb)
        assert sorted(ids) == live, f"epoch {epoch}: consumed ids differ from the corpus less the quarantined"
        assert max(ids.values()) == 1, f"epoch {epoch}: consumed twice: {[i for i, n in ids.items() if n > 1]}"
