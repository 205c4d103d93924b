"""``natsauth``: credential flags become nats-py connect options, per rank."""

import os
import ssl
import subprocess

import pytest

from mmfeed_trainer.__main__ import parse_args
from mmfeed_trainer.data.natsauth import NatsAuth


def test_rank_placeholders_and_password_file(tmp_path):
    (tmp_path / "trainer-1-0.pass").write_text("s3cret\n")
    auth = NatsAuth(user="trainer-{dp}-{mp}", password_file=str(tmp_path / "trainer-{dp}-{mp}.pass"))
    assert auth.options(1, 0) == {"user": "trainer-1-0", "password": "s3cret"}
    with pytest.raises(FileNotFoundError):
        auth.options(0, 0)  # rank 0's file is not on this node


@pytest.mark.parametrize("fields, match", [
    (dict(user="u", password="p", token="t"), "one authentication method"),
    (dict(token="t", creds="c.creds"), "one authentication method"),
    (dict(password="p"), "needs a user"),
    (dict(user="u", password="p", password_file="f"), "not both"),
    (dict(tls_cert="c.pem"), "both cert and key"),
])
def test_invalid(fields, match):
    with pytest.raises(ValueError, match=match):
        NatsAuth(**fields)


def test_methods_map_to_nats_py():
    assert NatsAuth(token="t").options(0, 0) == {"token": "t"}
    assert NatsAuth(nkey="seeds/{dp}.nk").options(3, 0) == {"nkeys_seed": "seeds/3.nk"}
    assert NatsAuth(creds="c/{dp}-{mp}.creds").options(2, 1) == {"user_credentials": "c/2-1.creds"}


def test_tls_context_trusts_the_ca(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bin_ = os.path.join(repo, "bin", "mmfeed")
    if not os.path.exists(bin_):
        pytest.skip("bin/mmfeed not built")
    subprocess.run([bin_, "creds", "--job", "j", "--dp", "1", "--out", str(tmp_path), "--tls-hosts", "h"],
                   check=True, capture_output=True)
    opts = NatsAuth(tls_ca=str(tmp_path / "ca.pem"), tls_cert=str(tmp_path / "client-cert.pem"),
                    tls_key=str(tmp_path / "client-key.pem")).options(0, 0)
    assert isinstance(opts["tls"], ssl.SSLContext) and opts["tls"].verify_mode == ssl.CERT_REQUIRED
    assert opts["tls"].get_ca_certs()[0]["subject"] == ((("commonName", "mmfeed CA"),),)


def test_cli_flags(monkeypatch):
    monkeypatch.setenv("MMFEED_NATS_PASSWORD", "from-env")
    cfg = parse_args(["--nats", "nats://h:4222", "--nats-user", "trainer-{dp}-{mp}", "--nats-tls-ca", "ca.pem"])
    assert cfg.nats_auth == NatsAuth(user="trainer-{dp}-{mp}", password="from-env", tls_ca="ca.pem")
    assert parse_args(["--nats", "nats://h:4222"]).nats_auth is None
