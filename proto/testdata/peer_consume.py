"""Conformance peer: a minimal Python client of docs/protocol.md.

usage: peer_consume.py NATS_URL JOB DP MP COUNT
Registers nothing (the Go test plays the service); binds to the rank's
durable consumer, reassembles COUNT batches following section 4, verifies
headers and CRC-32C, decodes each payload with pyarrow, acks every chunk,
and prints one JSON line per batch. Exits non-zero on any violation.
"""
import asyncio
import json
import sys

import numpy as np
import nats
import pyarrow as pa

REQUIRED = ["Mmfeed-Job", "Mmfeed-Epoch", "Mmfeed-Step", "Mmfeed-Micro-Batch", "Mmfeed-Dp-Rank",
            "Mmfeed-Mp-Rank", "Mmfeed-Chunk", "Mmfeed-Size", "Mmfeed-Checksum", "Mmfeed-Schema", "Nats-Msg-Id"]


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc32c_table()


def crc32c(b):
    try:
        import crc32c as fast  # pip install crc32c
        return fast.crc32c(b)
    except ImportError:
        c = 0xFFFFFFFF
        for x in b:
            c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF


def canon(s):
    assert s.isdigit() and (s == "0" or s[0] != "0"), s
    return int(s)


def parse(h):
    for k in REQUIRED:
        assert k in h, f"missing header {k}"
    assert h["Mmfeed-Schema"] == "1"
    i, n = (canon(x) for x in h["Mmfeed-Chunk"].split("/"))
    assert 0 <= i < n
    algo, hexsum = h["Mmfeed-Checksum"].split(":")
    assert algo == "crc32c" and len(hexsum) == 8 and hexsum == hexsum.lower()
    key = (h["Mmfeed-Job"],) + tuple(canon(h[k]) for k in REQUIRED[1:6])
    gen = canon(h.get("Mmfeed-Generation", "0"))
    msg_id = ".".join(str(x) for x in key + (i,)) + (f".g{gen}" if gen else "")
    assert h["Nats-Msg-Id"] == msg_id, (h["Nats-Msg-Id"], msg_id)
    return key, gen, i, n, canon(h["Mmfeed-Size"]), int(hexsum, 16)


async def main(url, job, dp, mp, count):
    nc = await nats.connect(url)
    assert nc.max_payload > 1024
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind(durable=f"mmfeed_{job}_{dp}_{mp}", stream=f"MMFEED_{job}")
    parts, done = {}, 0
    while done < count:
        for msg in await sub.fetch(16, timeout=10):
            assert msg.subject == f"mmfeed.{job}.batch.{dp}.{mp}", msg.subject
            key, gen, i, n, size, checksum = parse(msg.headers)
            p = parts.setdefault((key, gen), {"n": n, "size": size, "sum": checksum, "chunks": {}})
            assert (p["n"], p["size"], p["sum"]) == (n, size, checksum), "inconsistent chunks"
            p["chunks"].setdefault(i, []).append(msg)
            if len(p["chunks"]) < n:
                continue
            payload = b"".join(p["chunks"][j][0].data for j in range(n))
            assert len(payload) == size, (len(payload), size)
            assert crc32c(payload) == checksum, "checksum mismatch"
            batch = pa.ipc.open_stream(payload).read_next_batch()
            md = {k.decode(): v.decode() for k, v in batch.schema.metadata.items()}
            assert md["mmfeed.job"] == key[0] and int(md["mmfeed.epoch"]) == key[1]
            assert set(batch.column("step").to_pylist()) <= {key[2]}
            out = {"key": list(key), "chunks": n, "modality": md["mmfeed.modality"],
                   "ids": batch.column("id").to_pylist()}
            if "pixel_values" in batch.schema.names:
                pv = batch.column("pixel_values")
                out["pixel_sum"] = int(np.asarray(pv.values.to_numpy(zero_copy_only=False), dtype=np.int64).sum())
            print(json.dumps(out), flush=True)
            for ms in p["chunks"].values():
                for m in ms:
                    await m.ack()
            del parts[(key, gen)]
            done += 1
    await nc.flush()
    await nc.close()


if __name__ == "__main__":
    a = sys.argv
    asyncio.run(main(a[1], a[2], int(a[3]), int(a[4]), int(a[5])))
