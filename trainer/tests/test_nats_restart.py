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
import time

import pytest

from _dist import free_port
from test_cluster import check_delivered_once, planned
from test_stream import nats_server_binary, wait_for_port
from _ranks import StreamRanks

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
        ranks = StreamRanks(nats.url, "restart").start()
        total = len(want) // 2
        ranks.wait_progress(total // 4, total, deadline_s=120)  # a quarter in: mid-epoch 0
        at = list(ranks.progress)
        nats.kill()
        time.sleep(DOWN_S)
        nats.start()
        ranks.join(180, total, log.read_text)
        try:
            code = serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = "still running 60 s after the trainers' end"
        assert code == 0, log.read_text()[-4000:]
        assert max(at) < total, f"the server restarted after the trainers' end ({at} of {total})"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        nats.kill()
    print(f"nats restart ({plane}): killed at micro-batches {at} of {total} per rank, down {DOWN_S} s")
    check_delivered_once(ranks.got, want, manifest, quarantined, dropped, EPOCHS)
