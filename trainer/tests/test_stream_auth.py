"""``Stream`` against ``bin/mmfeed serve`` with per-rank credentials and TLS (docs/security.md).

``mmfeed creds`` writes the job's users and a private CA; the service loads them with
``--nats-config`` and ``--nats-listen-tls-*``. Each rank connects with its own credentials
(one flag set for every rank: ``{dp}`` in the paths) over TLS and receives every batch of the
plan exactly once; a rank that claims another rank's coordinates with its own credentials is
refused by the server's permissions and never registers; a client that does not trust the
CA, or has no credentials, cannot connect.
"""

import asyncio
import os
import subprocess
import threading

import nats
import pytest

from _dist import free_port
from test_stream import wait_for_port
from mmfeed_trainer.data.natsauth import NatsAuth
from mmfeed_trainer.data.stream import Stream, StreamError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin", "mmfeed")
PLAN = ["--dp", "2", "--global-batch", "8", "--micro-batches", "2", "--image-size", "32", "--seed", "5"]


def run(*args):
    return subprocess.run([BIN, *args], check=True, capture_output=True, text=True, timeout=300)


def test_stream_with_rank_credentials_over_tls(mmfeed, tmp_path):
    run("synth", "--out", str(tmp_path / "corpus"), "--samples", "40", "--seed", "3")
    creds = tmp_path / "creds"
    run("creds", "--job", "authtest", "--dp", "2", "--out", str(creds), "--tls-hosts", "127.0.0.1")
    port = free_port()
    serve = subprocess.Popen([BIN, "serve", "--input", str(tmp_path / "corpus" / "manifest.jsonl"), *PLAN,
                              "--job", "authtest", "--data-dir", str(tmp_path / "serve"),
                              "--nats-listen", f"127.0.0.1:{port}", "--http", "",
                              "--nats-config", str(creds / "auth.conf"),
                              "--nats-listen-tls-cert", str(creds / "server-cert.pem"),
                              "--nats-listen-tls-key", str(creds / "server-key.pem")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"nats://127.0.0.1:{port}"
    auth = NatsAuth(user="trainer-{dp}-{mp}", password_file=str(creds / "trainer-{dp}-{mp}.pass"),
                    tls_ca=str(creds / "ca.pem"))
    try:
        wait_for_port(port, deadline_s=60)

        async def refused(**kw):
            with pytest.raises(Exception):
                nc = await nats.connect(url, allow_reconnect=False, connect_timeout=5, max_reconnect_attempts=0, **kw)
                await nc.close()
        asyncio.run(refused(**auth.options(0, 0) | {"tls": None}))  # does not trust the CA
        asyncio.run(refused(tls=auth.options(0, 0)["tls"]))  # no credentials

        # Rank 0's credentials claiming rank 1: its register is not allowed through.
        wrong = NatsAuth(user="trainer-0-0", password_file=str(creds / "trainer-0-0.pass"), tls_ca=str(creds / "ca.pem"))
        impostor = Stream(url, "authtest", dp_rank=1, mp_rank=0, dp=2, epochs=1, request_timeout_s=1.0, wait_s=3.0,
                          auth=wrong)
        with pytest.raises(StreamError, match="could not register"):
            impostor.__enter__()
        impostor.close()

        got, errors = {}, []

        def rank(dp):
            try:
                with Stream(url, "authtest", dp_rank=dp, mp_rank=0, dp=2, epochs=1, request_timeout_s=10.0,
                            wait_s=60.0, auth=auth) as stream:
                    for mb in stream:
                        got[(mb["step"], dp, mb["micro_batch"])] = list(zip(mb["id"], mb["weight"].tolist()))
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
    assert got, "no batch delivered"
    real = [i for rows in got.values() for i, w in rows if w > 0]
    assert len(real) == len(set(real)), "a sample was delivered twice"
    assert len(real) >= 30, f"{len(real)} of 40 samples delivered"
    steps = {dp: {s for s, r, _ in got if r == dp} for dp in (0, 1)}
    assert steps[0] == steps[1]
