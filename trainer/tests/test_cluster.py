"""The scale-out path with real processes: a 3-server NATS cluster, a leading and a standby
``mmfeed serve``, and two ``Stream`` trainer ranks.

Mid-job the leading service is killed with SIGKILL (the standby takes over from the durable
state in the replicated KV bucket), then one NATS server is killed the same way. Every sample
of both epochs is delivered exactly once or quarantined, in plan order per rank (the ids of
every micro-batch are those ``mmfeed shard`` plans), with equal step and micro-batch counts.

``MMFEED_CLUSTER_LONG=1`` runs a longer job (``make test-cluster``).
"""

import json
import os
import signal
import subprocess
import time
from collections import defaultdict

import pytest

from _dist import free_ports
from test_stream import nats_server_binary, wait_for_port
from _ranks import StreamRanks

LONG = bool(os.environ.get("MMFEED_CLUSTER_LONG"))
SAMPLES = 640 if LONG else 160
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]
EPOCHS = 2


def start_cluster(tmp_path, binary, attempts=3):
    """Three nats-servers with JetStream, routed to each other on loopback ports.

    A port chosen free can be taken by another process before the server binds it; a server that
    exits at start is therefore retried with fresh ports instead of failing the test."""
    for attempt in range(attempts):
        procs, urls = _start_cluster_once(tmp_path / f"cluster{attempt}", binary)
        if procs is not None:
            return procs, urls
    raise RuntimeError(f"no 3-server cluster after {attempts} attempts; logs in {tmp_path}")


def _start_cluster_once(dir, binary):
    dir.mkdir(parents=True)
    found = free_ports(6)
    ports, routes = found[:3], found[3:]
    procs = []
    for i in range(3):
        others = ", ".join(f"nats-route://127.0.0.1:{routes[j]}" for j in range(3) if j != i)
        conf = dir / f"n{i}.conf"
        conf.write_text(f'server_name: n{i}\nlisten: "127.0.0.1:{ports[i]}"\n'
                        f'jetstream {{ store_dir: "{dir / f"js{i}"}" }}\n'
                        f'cluster {{ name: mmfeed, listen: "127.0.0.1:{routes[i]}", routes: [{others}] }}\n')
        procs.append(subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=open(dir / f"n{i}.log", "w")))
    try:
        for p, proc in zip(ports, procs):
            wait_for_port(p, proc=proc)
    except (TimeoutError, RuntimeError):
        for proc in procs:
            proc.kill()
            proc.wait()
        return None, None
    return procs, [f"nats://127.0.0.1:{p}" for p in ports]


def wait_for_jetstream(url, deadline_s=30.0):
    """Until the cluster has elected a JetStream meta leader (account info answers)."""
    import asyncio
    import nats

    async def probe():
        nc = await nats.connect(url)
        try:
            await nc.jetstream().account_info()
        finally:
            await nc.close()

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            asyncio.run(probe())
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def planned(run, tmp_path, manifest, plan, epochs):
    """What ``mmfeed shard`` plans per epoch: ids per (epoch, step, rank, mb), quarantined, dropped."""
    want, quarantined, dropped = defaultdict(list), {}, {}
    for epoch in range(epochs):
        out = tmp_path / f"shards{epoch}"
        run("shard", "--input", manifest, *plan, "--epoch", str(epoch), "--out", str(out))
        for line in open(out / "plan.jsonl"):
            p = json.loads(line)
            if "step" in p:
                want[(epoch, p["step"], p["rank"], p["micro_batch"])].append((p["id"], p["weight"]))
        quarantined[epoch] = {json.loads(l)["id"] for l in open(out / "quarantine.jsonl")}
        dropped[epoch] = {json.loads(l)["id"] for l in open(out / "plan.jsonl") if '"dropped"' in l}
    return want, quarantined, dropped


def check_delivered_once(got, want, manifest, quarantined, dropped, epochs):
    """Every (epoch, step, rank, micro-batch) as planned, in plan order, and every sample of each
    epoch delivered once, quarantined or dropped; both ranks got the same steps."""
    assert sorted(got) == sorted(want), "streamed (epoch, step, rank, micro-batch) differ from the plan"
    for key, rows in want.items():
        assert [i for i, _ in got[key]] == [i for i, _ in rows], key
    corpus = [json.loads(l).get("id") for l in open(manifest)]
    for epoch in range(epochs):
        real = [i for (e, *_), rows in got.items() if e == epoch for i, w in rows if w > 0]
        assert len(real) == len(set(real)), f"epoch {epoch}: a sample was delivered twice"
        assert len(real) + len(quarantined[epoch]) + len(dropped[epoch]) == len(corpus), f"epoch {epoch}"
        steps = {dp: {s for e, s, r, _ in got if e == epoch and r == dp} for dp in (0, 1)}
        assert steps[0] == steps[1] and steps[0], f"epoch {epoch}: ranks got different steps"


def test_cluster_survives_a_killed_leader_and_server(mmfeed, tmp_path):
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("no nats-server binary (set MMFEED_NATS_SERVER)")
    run = lambda *a: subprocess.run([mmfeed, *a], check=True, capture_output=True, text=True, timeout=300)
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    want, quarantined, dropped = planned(run, tmp_path, manifest, PLAN, EPOCHS)

    servers, urls = start_cluster(tmp_path, binary)
    services = []
    try:
        wait_for_jetstream(urls[0])
        for name in ("a", "b"):  # a leads, b stands by
            log = open(tmp_path / f"serve-{name}.log", "w")
            services.append(subprocess.Popen(
                [mmfeed, "serve", "--input", manifest, *PLAN, "--job", "cluster", "--epochs", str(EPOCHS),
                 "--recalibrate", "-1", "--nats", ",".join(urls), "--replicas", "3", "--lease-ttl", "6s",
                 "--data-dir", str(tmp_path / f"serve-{name}"), "--http", ""],
                stdout=log, stderr=subprocess.STDOUT))
            if name == "a":
                deadline = time.monotonic() + 60
                while "serving" not in (tmp_path / "serve-a.log").read_text():
                    assert services[0].poll() is None, (tmp_path / "serve-a.log").read_text()
                    assert time.monotonic() < deadline, "service a did not start"
                    time.sleep(0.1)
        ranks = StreamRanks(urls[:2], "cluster").start()
        total = len(want) // 2
        ranks.wait_progress(total // 4, total, deadline_s=120)
        services[0].send_signal(signal.SIGKILL)  # the leader dies mid-epoch
        services[0].wait()
        ranks.wait_progress(int(0.6 * total), total, deadline_s=120)
        assert "took over the job" in (tmp_path / "serve-b.log").read_text()
        servers[2].send_signal(signal.SIGKILL)  # and one NATS server
        servers[2].wait()
        ranks.join(180, total, (tmp_path / "serve-b.log").read_text)
        assert services[1].wait(timeout=60) == 0, (tmp_path / "serve-b.log").read_text()
    finally:
        for p in services + servers:
            if p.poll() is None:
                p.kill()
                p.wait()

    check_delivered_once(ranks.got, want, manifest, quarantined, dropped, EPOCHS)
