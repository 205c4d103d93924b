"""``mmfeed_trainer.stream.Stream`` against the real service: ``bin/mmfeed serve``.

Two dp ranks read a generated corpus (with broken samples) for one epoch through the public
client. Every sample is delivered exactly once or quarantined, both ranks get the same steps
and micro-batches, and each micro-batch holds exactly the ids, in order, that ``mmfeed shard``
plans for the same input and seed.
"""

import json
import os
import subprocess
import threading
import time
from collections import defaultdict

from _dist import free_port
from test_stream import wait_for_port
from mmfeed_trainer.data.stream import Stream

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
PLAN = ["--dp", "2", "--global-batch", "16", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]


def run(*args, **kw):
    return subprocess.run([BIN, *args], check=True, capture_output=True, text=True, timeout=300, **kw)


def test_stream_delivers_the_plan_exactly_once(mmfeed, tmp_path):
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", "120", "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    run("shard", "--input", manifest, *PLAN, "--out", str(tmp_path / "shards"))
    want = defaultdict(list)  # (step, rank, micro_batch) -> ids in plan order
    for line in open(tmp_path / "shards" / "plan.jsonl"):
        p = json.loads(line)
        if "step" in p:
            want[(p["step"], p["rank"], p["micro_batch"])].append((p["id"], p["weight"]))
    quarantined = {json.loads(l)["id"] for l in open(tmp_path / "shards" / "quarantine.jsonl")}

    port = free_port()
    serve = subprocess.Popen([BIN, "serve", "--input", manifest, *PLAN, "--job", "streamtest",
                              "--data-dir", str(tmp_path / "serve"), "--nats-listen", f"127.0.0.1:{port}",
                              "--http", ""], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port(port, deadline_s=60)
        got, errors = {}, []

        def rank(dp):
            try:
                stream = Stream(f"nats://127.0.0.1:{port}", "streamtest", dp_rank=dp, mp_rank=0, dp=2,
                                epochs=1, request_timeout_s=5.0)
                deadline = time.monotonic() + 60
                while True:  # the service answers register once its first epoch is planned
                    try:
                        stream.__enter__()
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.3)
                with stream:
                    for mb in stream:
                        assert mb["pixel_values"].shape[1:] == (3, 32, 32)
                        assert mb["input_ids"].shape == mb["attention_mask"].shape
                        got[(mb["step"], dp, mb["micro_batch"])] = list(zip(mb["id"], mb["weight"].tolist()))
                        stream.feedback(compute_seconds=0.01, samples=len(mb["id"]))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=rank, args=(dp,)) for dp in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert serve.wait(timeout=60) == 0, serve.stdout.read()
    finally:
        if serve.poll() is None:
            serve.kill()

    assert sorted(got) == sorted(want), "streamed (step, rank, micro-batch) differ from the plan"
    for key, rows in want.items():
        assert [i for i, _ in got[key]] == [i for i, _ in rows], key
    real = [i for rows in got.values() for i, w in rows if w > 0]
    assert len(real) == len(set(real)), "a sample was delivered twice"
    corpus = [json.loads(l).get("id") for l in open(manifest)]
    dropped = {json.loads(l)["id"] for l in open(tmp_path / "shards" / "plan.jsonl") if '"dropped"' in l}
    assert len(real) + len(quarantined) + len(dropped) == len(corpus)
    steps = {dp: {s for s, r, _ in got if r == dp} for dp in (0, 1)}
    assert steps[0] == steps[1] and steps[0]
