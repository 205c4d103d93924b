"""An external NATS server restarted under a running job: ``bin/mmfeed serve --nats URL`` and two
``Stream`` trainer ranks use one ``nats-server`` process (JetStream, file store). Mid-epoch the
server is killed with SIGKILL and started again on the same port and store; the service and the
trainers reconnect, and every sample of both epochs is delivered exactly once or quarantined, in
plan order per rank (the ids of every micro-batch are those ``mmfeed shard`` plans). Run for
both data planes: core (payloads in the service, state in JetStream) and jetstream (payloads in
the file-stored stream, which the restarted server recovers).
"""

import signal
import subprocess
import threading
import time

import pytest

from _dist import free_port
from test_cluster import check_delivered_once, planned
from test_stream import nats_server_binary, wait_for_port
from mmfeed_trainer.stream import Stream

SAMPLES, EPOCHS = 120, 2
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]
DOWN_S = 1.0
"""How long the server stays down (the service's lease, 5 s by default, must survive it)."""


class NatsServer:
    """One nats-server with JetStream in a file store, on a fixed port; ``kill`` and ``start``
    again keep the port and the store."""

    def __init__(self, binary, tmp_path):
        self.port = free_port()
        self.conf = tmp_path / "nats.conf"
        self.conf.write_text(f'listen: "127.0.0.1:{self.port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n')
        self.binary, self.log, self.proc = binary, tmp_path / "nats.log", None
        self.url = f"nats://127.0.0.1:{self.port}"

    def start(self):
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=open(self.log, "a"),
                                     stderr=subprocess.STDOUT)
        wait_for_port(self.port, proc=self.proc)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.mark.parametrize("plane", ["core", "jetstream"])
def test_nats_server_restart_mid_epoch(mmfeed, tmp_path, plane):
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("no nats-server binary (set MMFEED_NATS_SERVER)")
    run = lambda *a: subprocess.run([mmfeed, *a], check=True, capture_output=True, text=True, timeout=300)
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", str(SAMPLES), "--seed", "3", "--bad-fraction", "0.05")
    manifest = str(tmp_path / "corpus" / "manifest.jsonl")
    want, quarantined, dropped = planned(run, tmp_path, manifest, PLAN, EPOCHS)

    nats = NatsServer(binary, tmp_path)
    nats.start()
    log = tmp_path / "serve.log"
    serve = subprocess.Popen(
        [mmfeed, "serve", "--input", manifest, *PLAN, "--job", "restart", "--epochs", str(EPOCHS), "--recalibrate", "-1",
         "--data-plane", plane, "--nats", nats.url, "--data-dir", str(tmp_path / "serve"), "--http", ""],
        stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "serving" not in log.read_text():
            assert serve.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.1)
        got, errors, progress = {}, [], [0, 0]

        def rank(dp):
            try:
                with Stream(nats.url, "restart", dp_rank=dp, mp_rank=0, dp=2, request_timeout_s=5.0,
                            fetch_timeout_s=2.0) as stream:
                    for mb in stream:
                        got[(mb["epoch"], mb["step"], dp, mb["micro_batch"])] = list(zip(mb["id"], mb["weight"].tolist()))
                        progress[dp] += 1
                        stream.feedback(compute_seconds=0.01, samples=len(mb["id"]))
                        time.sleep(0.03)  # training
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=rank, args=(dp,)) for dp in (0, 1)]
        for t in threads:
            t.start()
        total = len(want) // 2
        deadline = time.monotonic() + 120
        while min(progress) < total // 4 and not errors:  # a quarter in: mid-epoch 0
            assert time.monotonic() < deadline, f"no progress: {progress} of {total}"
            time.sleep(0.02)
        at = list(progress)
        nats.kill()
        time.sleep(DOWN_S)
        nats.start()
        for t in threads:
            t.join(timeout=180)
        assert not any(t.is_alive() for t in threads), f"trainers stuck at {progress} of {total}: " + \
            log.read_text()[-3000:]
        assert not errors, errors
        assert serve.wait(timeout=60) == 0, log.read_text()[-4000:]
        assert max(at) < total, f"the server restarted after the trainers' end ({at} of {total})"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        nats.kill()
    print(f"nats restart ({plane}): killed at micro-batches {at} of {total} per rank, down {DOWN_S} s")
    check_delivered_once(got, want, manifest, quarantined, dropped, EPOCHS)
