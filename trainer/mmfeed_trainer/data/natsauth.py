"""NATS credentials and TLS of a trainer rank (docs/security.md), as nats-py connect options.

A service started with ``mmfeed serve --nats-config auth.conf`` (``mmfeed creds`` writes it)
accepts a trainer rank only with the credentials of that rank, which may use that rank's
subjects only. Every process of a ``torchrun`` job gets the same command line, so file paths
and the user name may hold ``{dp}`` and ``{mp}``, replaced by the rank's own coordinates:

    torchrun --nproc-per-node 4 -m mmfeed_trainer --nats nats://feeder:4222 --job demo \\
        --nats-user 'trainer-{dp}-{mp}' --nats-password-file '/etc/mmfeed/demo/trainer-{dp}-{mp}.pass' \\
        --nats-tls-ca /etc/mmfeed/demo/ca.pem

At most one of user/password, token, NKey seed and creds (JWT) file; TLS options combine
with any of them.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class NatsAuth:
    """How a rank authenticates to NATS. Every str field may hold ``{dp}`` and ``{mp}``."""

    user: str | None = None
    """User name (with ``password`` or ``password_file``)."""
    password: str | None = None
    password_file: str | None = None
    """File whose first line is the password (what ``mmfeed creds`` writes, one per rank)."""
    token: str | None = None
    nkey: str | None = None
    """NKey seed file (nats-py needs the ``nkeys`` package for it)."""
    creds: str | None = None
    """NATS credentials (JWT + seed) file of an operator-mode deployment."""
    tls_ca: str | None = None
    """CA certificate that signed the server's certificate."""
    tls_cert: str | None = None
    tls_key: str | None = None
    """Client certificate and key, for servers that require them."""

    def __post_init__(self) -> None:
        methods = [m for m, on in (("user/password", self.user or self.password or self.password_file),
                                   ("token", self.token), ("nkey", self.nkey), ("creds", self.creds)) if on]
        if len(methods) > 1:
            raise ValueError(f"nats auth: one authentication method, got {' and '.join(methods)}")
        if (self.password or self.password_file) and not self.user:
            raise ValueError("nats auth: a password needs a user")
        if self.password and self.password_file:
            raise ValueError("nats auth: give the password or a password file, not both")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("nats auth: a TLS client certificate needs both cert and key")

    def options(self, dp: int, mp: int) -> dict:
        """nats-py ``connect`` keyword arguments for rank (dp, mp)."""
        sub = (lambda s: s.format(dp=dp, mp=mp) if s else s)
        opts: dict = {}
        if self.user:
            opts["user"] = sub(self.user)
            pw = self.password
            if self.password_file:
                with open(sub(self.password_file), encoding="utf-8") as f:
                    pw = f.readline().strip()
            if pw is None:
                raise ValueError(f"nats auth: user {opts['user']!r} without a password")
            opts["password"] = pw
        if self.token:
            opts["token"] = self.token
        if self.nkey:
            opts["nkeys_seed"] = sub(self.nkey)
        if self.creds:
            opts["user_credentials"] = sub(self.creds)
        if self.tls_ca or self.tls_cert:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=sub(self.tls_ca) if self.tls_ca else None)
            if self.tls_cert:
                ctx.load_cert_chain(sub(self.tls_cert), sub(self.tls_key))
            opts["tls"] = ctx
        return opts


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--nats-*`` credential flags (values may hold {dp} and {mp})."""
    g = p.add_argument_group("NATS credentials and TLS (values may hold {dp} and {mp}; docs/security.md)")
    g.add_argument("--nats-user", help="user name, e.g. trainer-{dp}-{mp} (from mmfeed creds)")
    g.add_argument("--nats-password", help="password (default $MMFEED_NATS_PASSWORD with --nats-user)")
    g.add_argument("--nats-password-file", help="file holding the password, e.g. creds/trainer-{dp}-{mp}.pass")
    g.add_argument("--nats-token", help="token (default $MMFEED_NATS_TOKEN without another method)")
    g.add_argument("--nats-nkey", help="NKey seed file (needs the nkeys package)")
    g.add_argument("--nats-creds", help="NATS credentials (JWT) file")
    g.add_argument("--nats-tls-ca", help="CA certificate of the NATS server (mmfeed creds --tls-hosts writes ca.pem)")
    g.add_argument("--nats-tls-cert", help="client certificate")
    g.add_argument("--nats-tls-key", help="client key")


def from_args(a: argparse.Namespace) -> NatsAuth | None:
    """The NatsAuth the flags describe; None when none is set."""
    password = a.nats_password
    if a.nats_user and not password and not a.nats_password_file:
        password = os.environ.get("MMFEED_NATS_PASSWORD")
    token = a.nats_token
    if not token and not (a.nats_user or a.nats_nkey or a.nats_creds):
        token = os.environ.get("MMFEED_NATS_TOKEN") or None
    fields = dict(user=a.nats_user, password=password, password_file=a.nats_password_file, token=token,
                  nkey=a.nats_nkey, creds=a.nats_creds, tls_ca=a.nats_tls_ca, tls_cert=a.nats_tls_cert,
                  tls_key=a.nats_tls_key)
    if not any(fields.values()):
        return None
    return NatsAuth(**fields)
