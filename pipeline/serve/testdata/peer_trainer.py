"""Python conformance peer of the service: a minimal trainer rank by docs/protocol.md.

usage: peer_trainer.py NATS_URL JOB DP MP DP_RANK MP_RANK PLACEMENT

Registers for epoch 0, pulls the rank's durable consumer, reassembles chunks (sections 3-4),
checks size and CRC-32C, decodes each payload with pyarrow, checks schema metadata against the
headers, "trains" each whole step (records it), acknowledges its chunks, publishes feedback, and
after the epoch's last step publishes done and registers for the next epoch on the same
connection, until the service refuses (no more epochs). Prints one JSON line per applied batch:
{"epoch", "step", "mb", "ids", "weights", "columns"}. Exits non-zero on any violation.
"""
import asyncio
import json
import sys

import crc32c
import nats
import nats.errors
import pyarrow as pa


def header(msg, name):
    vals = msg.headers.get(name) if msg.headers else None
    if vals is None:
        raise SystemExit(f"chunk on {msg.subject} lacks header {name}")
    return vals


async def register(nc, job, reg, deadline_s=90.0):
    """The register of protocol section 7: asked again while the epoch is being planned
    (``retry: true``) or the answer is slow (a loaded machine), until deadline_s."""
    end = asyncio.get_running_loop().time() + deadline_s
    while True:
        try:
            msg = await nc.request(f"mmfeed.{job}.ctl.register", json.dumps(reg).encode(), timeout=30)
            rep = json.loads(msg.data)
            if rep["ok"] or not rep.get("retry"):
                return rep
        except nats.errors.TimeoutError:
            pass
        if asyncio.get_running_loop().time() > end:
            raise SystemExit("register: no answer within the deadline")
        await asyncio.sleep(0.5)


async def main():
    url, job = sys.argv[1], sys.argv[2]
    dp, mp, dp_rank, mp_rank = (int(x) for x in sys.argv[3:7])
    placement = sys.argv[7]
    nc = await nats.connect(url, max_reconnect_attempts=-1)
    js = nc.jetstream()
    sub = None
    epoch = 0
    delivered = set()   # batch keys already applied (rule 7)
    parts = {}          # (key, gen) -> {index: msg}
    backlog = []        # fetched, not yet looked at
    while True:
        reg = {"job": job, "dp_rank": dp_rank, "mp_rank": mp_rank, "dp": dp, "mp": mp,
               "placement": placement, "epoch": epoch, "resume_step": 0}
        rep = await register(nc, job, reg)
        if not rep["ok"]:
            if "outside the job" in rep["error"]:
                break
            raise SystemExit(f"register refused: {rep['error']}")
        if sub is None:
            sub = await js.pull_subscribe(rep["subject"], durable=rep["consumer"], stream=rep["stream"])
        steps, mbs = rep["steps"], rep["micro_batches"]
        step, mb, held = 0, 0, []
        while step < steps:
            if not backlog:
                try:
                    backlog.extend(await sub.fetch(64, timeout=5))
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    continue
            while backlog and step < steps:  # the rest belongs to the next epoch
                m = backlog.pop(0)
                key = tuple(int(header(m, h)) for h in ("Mmfeed-Epoch", "Mmfeed-Step", "Mmfeed-Micro-Batch"))
                gen = int(m.headers.get("Mmfeed-Generation", "0"))
                i, n = (int(x) for x in header(m, "Mmfeed-Chunk").split("/"))
                if key in delivered or key < (epoch, step, mb):
                    await m.ack()
                    continue
                p = parts.setdefault((key, gen), {})
                p.setdefault(i, m)
                if len(p) < n:
                    continue
                payload = b"".join(p[j].data for j in range(n))
                if len(payload) != int(header(m, "Mmfeed-Size")):
                    raise SystemExit(f"{key}: size mismatch")
                if f"crc32c:{crc32c.crc32c(payload):08x}" != header(m, "Mmfeed-Checksum"):
                    raise SystemExit(f"{key}: checksum mismatch")
                rec = pa.ipc.open_stream(payload).read_next_batch()
                md = {k.decode(): v.decode() for k, v in rec.schema.metadata.items()}
                want = {"mmfeed.job": job, "mmfeed.epoch": str(key[0]), "mmfeed.dp_rank": str(dp_rank),
                        "mmfeed.mp_rank": str(mp_rank), "mmfeed.schema_version": "1"}
                if any(md.get(k) != v for k, v in want.items()):
                    raise SystemExit(f"{key}: schema metadata {md}")
                if key != (epoch, step, mb):
                    raise SystemExit(f"got batch {key}, want {(epoch, step, mb)}: out of plan order")
                held.append((key, rec, list(p.values())))
                del parts[(key, gen)]
                delivered.add(key)
                mb += 1
                if mb < mbs:
                    continue
                for k, r, tags in held:  # "train", then ack
                    print(json.dumps({"epoch": k[0], "step": k[1], "mb": k[2], "ids": r.column("id").to_pylist(),
                                      "weights": r.column("weight").to_pylist(), "columns": r.schema.names}))
                    for t in tags:
                        await t.ack()
                fb = {"job": job, "epoch": epoch, "step": step, "dp_rank": dp_rank, "mp_rank": mp_rank,
                      "compute_seconds": 0.01, "data_wait_seconds": 0.0, "samples": 1}
                await nc.publish(f"mmfeed.{job}.ctl.feedback", json.dumps(fb).encode())
                step, mb, held = step + 1, 0, []
        done = {"job": job, "epoch": epoch, "dp_rank": dp_rank, "mp_rank": mp_rank, "steps": steps}
        await nc.publish(f"mmfeed.{job}.ctl.done", json.dumps(done).encode())
        epoch += 1
    await nc.drain()


asyncio.run(main())
