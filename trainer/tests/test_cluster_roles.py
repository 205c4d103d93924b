"""The planner/worker roles on a real 3-server NATS cluster, all real processes.

Two ``mmfeed serve --role planner`` with the same ``--job`` (a leads; b stands by on the KV
lease, ``--lease-ttl``), two ``--role worker`` on different servers, and two ``Stream``
trainer ranks. Mid-epoch the leading planner is killed with SIGKILL, then one worker: the
standby takes over within a few seconds (measured from the kill to its "took over the job"
log line and to the next micro-batch a rank receives), and every sample of every epoch is
delivered exactly once or quarantined, in plan order per rank (the ids of every
micro-batch are those ``mmfeed shard`` plans), with equal step counts per rank.

``MMFEED_CLUSTER_LONG=1`` (``make test-cluster``) runs two epochs of a larger corpus and
also kills one NATS server once the standby leads.
"""

import json
import os
import signal
import subprocess
import time

import pytest

from test_cluster import check_delivered_once, planned, start_cluster, wait_for_jetstream
from test_stream import nats_server_binary
from test_workers import wait_for_log
from _ranks import StreamRanks

LONG = bool(os.environ.get("MMFEED_CLUSTER_LONG"))
SAMPLES = 480 if LONG else 160
EPOCHS = 2 if LONG else 1
LEASE_TTL_S = 3.0
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]


def test_standby_planner_and_workers_on_a_cluster(mmfeed, tmp_path):
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("no nats-server binary (set MMFEED_NATS_SERVER)")
    run = lambda *a: subprocess.run([mmfeed, *a], check=True, capture_output=True, text=True, timeout=300)
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    want, quarantined, dropped = planned(run, tmp_path, manifest, PLAN, EPOCHS)

    servers, urls = start_cluster(tmp_path, binary)
    logs = {n: tmp_path / f"{n}.log" for n in ("planner-a", "planner-b", "worker-a", "worker-b")}
    procs = {}

    def planner(name):
        return subprocess.Popen(
            [mmfeed, "serve", "--role", "planner", "--input", manifest, *PLAN, "--job", "roles",
             "--epochs", str(EPOCHS), "--recalibrate", "-1", "--nats", ",".join(urls), "--replicas", "3",
             "--lease-ttl", f"{LEASE_TTL_S}s", "--work-ack-wait", "1s",
             "--stream-max-bytes", "150000",  # backpressure: the leader keeps pace with the trainers
             "--data-dir", str(tmp_path / name), "--http", ""],
            stdout=open(logs[name], "w"), stderr=subprocess.STDOUT)

    def worker(name, url):
        return subprocess.Popen([mmfeed, "serve", "--role", "worker", "--nats", url, "--slots", "1"],
                                stdout=open(logs[name], "w"), stderr=subprocess.STDOUT)

    try:
        wait_for_jetstream(urls[0])
        procs["planner-a"] = planner("planner-a")
        wait_for_log(logs["planner-a"], "serving", procs["planner-a"])
        procs["planner-b"] = planner("planner-b")
        wait_for_log(logs["planner-b"], "standing by", procs["planner-b"])
        procs["worker-a"] = worker("worker-a", ",".join(urls[1:] + urls[:1]))
        procs["worker-b"] = worker("worker-b", ",".join(urls[2:] + urls[:2]))

        ranks = StreamRanks(urls[:2], "roles", train_s=0.04).start()
        total = len(want) // 2
        ranks.wait_progress(total // (4 * EPOCHS), total)
        delivered_at_kill = list(ranks.progress)

        killed = time.monotonic()
        procs["planner-a"].send_signal(signal.SIGKILL)  # the leader dies mid-epoch
        procs["planner-a"].wait()
        wait_for_log(logs["planner-b"], "took over the job", procs["planner-b"], deadline_s=30)
        took_over = time.monotonic()
        took_over_s = took_over - killed
        procs["worker-a"].send_signal(signal.SIGKILL)  # and one worker, with items in hand
        procs["worker-a"].wait()
        ranks.wait_progress(max(delivered_at_kill) + 2, total)
        deadline = time.monotonic() + 60  # both ranks receive a batch the standby built
        while not all(a and a[-1] > took_over for a in ranks.arrivals) and not ranks.errors:
            assert time.monotonic() < deadline, f"no batch from the standby: {ranks.progress} of {total}"
            time.sleep(0.02)
        resumed_s = max(next(t for t in a if t > took_over) for a in ranks.arrivals) - killed
        print(f"\ntakeover: lease taken {took_over_s:.1f} s and next micro-batch {resumed_s:.1f} s "
              f"after the SIGKILL (lease TTL {LEASE_TTL_S} s)")
        assert took_over_s < 2 * LEASE_TTL_S + 2, took_over_s
        if LONG:
            servers[2].send_signal(signal.SIGKILL)  # and one NATS server
            servers[2].wait()
        ranks.join(240 if LONG else 90, total, logs["planner-b"].read_text)
        assert procs["planner-b"].wait(timeout=60) == 0, logs["planner-b"].read_text()
        assert "opened dataset" in logs["worker-b"].read_text()
    finally:
        for p in list(procs.values()) + servers:
            if p.poll() is None:
                p.kill()
                p.wait()

    check_delivered_once(ranks.got, want, manifest, quarantined, dropped, EPOCHS)
