"""``mmfeed serve --role planner`` with ``--role worker`` processes, all real processes.

The planner runs the embedded NATS server and preprocesses nothing itself; worker a starts
with it, worker b joins once the trainers have made progress, and then worker a is killed
with SIGKILL in the middle of the epoch (its unfinished items go to worker b after the
work queue's ack wait). Two ``Stream`` trainer ranks receive every planned micro-batch, in
plan order, with the ids ``mmfeed shard`` plans, and every sample once (or quarantined, or
dropped).
"""

import json
import signal
import subprocess
import time
from collections import defaultdict

from _dist import free_port
from test_stream import wait_for_port
from _ranks import StreamRanks

SAMPLES = 160
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]


def wait_for_log(path, text, proc, deadline_s=60.0):
    deadline = time.monotonic() + deadline_s
    while text not in path.read_text():
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in {path}"
        time.sleep(0.05)


def test_planner_and_workers_deliver_every_sample_once(mmfeed, tmp_path):
    run = lambda *a: subprocess.run([mmfeed, *a], check=True, capture_output=True, text=True, timeout=120)
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    out = tmp_path / "shards"
    run("shard", "--input", manifest, *PLAN, "--out", str(out))
    want = defaultdict(list)
    for line in open(out / "plan.jsonl"):
        p = json.loads(line)
        if "step" in p:
            want[(0, p["step"], p["rank"], p["micro_batch"])].append((p["id"], p["weight"]))
    quarantined = {json.loads(l)["id"] for l in open(out / "quarantine.jsonl")}
    dropped = {json.loads(l)["id"] for l in open(out / "plan.jsonl") if '"dropped"' in l}

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    logs = {n: tmp_path / f"{n}.log" for n in ("planner", "a", "b")}
    worker = lambda n: subprocess.Popen([mmfeed, "serve", "--role", "worker", "--nats", url, "--slots", "1"],
                                        stdout=open(logs[n], "w"), stderr=subprocess.STDOUT)
    procs = {}
    try:
        procs["planner"] = subprocess.Popen(
            [mmfeed, "serve", "--role", "planner", "--input", manifest, *PLAN, "--job", "workers",
             "--recalibrate", "-1", "--nats-listen", f"127.0.0.1:{port}", "--work-ack-wait", "500ms",
             "--stream-max-bytes", "150000",  # backpressure (two steps): the planner keeps pace with the trainers
             "--data-dir", str(tmp_path / "planner"), "--http", ""],
            stdout=open(logs["planner"], "w"), stderr=subprocess.STDOUT)
        wait_for_port(port)
        wait_for_log(logs["planner"], "serving", procs["planner"])
        procs["a"] = worker("a")
        ranks = StreamRanks(url, "workers", train_s=0.04).start()
        total = len(want) // 2
        ranks.wait_progress(2, total)
        procs["b"] = worker("b")  # joins late
        wait_for_log(logs["b"], "worker ready", procs["b"])
        ranks.wait_progress(total // 3, total)
        procs["a"].send_signal(signal.SIGKILL)  # leaves early, mid-epoch
        procs["a"].wait()
        ranks.join(60, total, logs["planner"].read_text)
        assert procs["planner"].wait(timeout=30) == 0, logs["planner"].read_text()
        assert "opened dataset" in logs["b"].read_text()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    got = ranks.got
    assert sorted(got) == sorted(want), "streamed (epoch, step, rank, micro-batch) differ from the plan"
    for key, rows in want.items():
        assert [i for i, _ in got[key]] == [i for i, _ in rows], key
    corpus = [json.loads(l).get("id") for l in open(manifest)]
    real = [i for rows in got.values() for i, w in rows if w > 0]
    assert len(real) == len(set(real)), "a sample was delivered twice"
    assert len(real) + len(quarantined) + len(dropped) == len(corpus)
