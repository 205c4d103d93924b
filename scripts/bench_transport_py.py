"""The Python receive path against raw nats-py, side by side (`make bench` section transport_py).

    python scripts/bench_transport_py.py NATS_URL [--batches 40] [--rounds 3]

One nats-py connection publishes batches (an Arrow IPC stream of 32 rows of 294 KiB, about
9.2 MiB, as BenchmarkTransport's larger batch) in chunks of the server's max_payload - 1024, at
most 4 batches ahead of the receiver; another connection receives them. ``raw`` publishes the
chunks bare and the receiver counts bytes. ``mmfeed`` publishes the same bytes with the chunk
headers of docs/protocol.md section 3, and the receiver does what the trainer's stream client
does with each chunk: ``wire.Reassembler`` (one bytearray per batch, CRC-32C as chunks arrive)
and a zero-copy Arrow decode. Both run in one process and one event loop, so what differs is
the receiver's per-byte work. Rounds alternate the modes; the median round of each is printed
as JSON: MB/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import nats
import pyarrow as pa

from mmfeed_trainer import wire

AHEAD = 4
ROWS, ROW_BYTES = 32, 3 * 224 * 224 * 2


def make_payload() -> bytes:
    rows = [os.urandom(ROW_BYTES) for _ in range(ROWS)]
    rec = pa.record_batch([pa.array([f"s{i}" for i in range(ROWS)]), pa.array(rows, pa.binary())], names=["id", "pixels"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rec.schema) as w:
        w.write_batch(rec)
    return sink.getvalue().to_pybytes()


async def run_round(url: str, mode: str, batches: list, size: int) -> float:
    pub, sub = await nats.connect(url), await nats.connect(url)
    confirmed = asyncio.Queue()
    subj = f"bench.{mode}"
    got = 0
    reasm = wire.Reassembler(max_pending=2 * AHEAD)

    async def on_raw(m):
        nonlocal got
        got += len(m.data)
        if got >= size:
            got -= size
            confirmed.put_nowait(None)

    async def on_mmfeed(m):
        for res in reasm.add(m.headers, m.data):
            if res.error or res.duplicate:
                raise RuntimeError(f"batch {res.header.key}: {res.error or 'duplicate'}")
            rec = pa.ipc.open_stream(pa.py_buffer(res.payload)).read_next_batch()
            if rec.num_rows != ROWS:
                raise RuntimeError(f"{rec.num_rows} rows")
            confirmed.put_nowait(None)

    await sub.subscribe(subj, cb=on_raw if mode == "raw" else on_mmfeed, pending_bytes_limit=1 << 30)
    await sub.flush()
    start = time.perf_counter()
    for i, chunks in enumerate(batches):
        if i >= AHEAD:
            await asyncio.wait_for(confirmed.get(), 60)
        for headers, data in chunks:
            await pub.publish(subj, data, headers=headers if mode == "mmfeed" else None)
    await pub.flush()
    for _ in range(min(AHEAD, len(batches))):
        await asyncio.wait_for(confirmed.get(), 60)
    elapsed = time.perf_counter() - start
    await pub.close()
    await sub.close()
    return len(batches) * size / elapsed / 1e6


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    nc = await nats.connect(args.url)
    chunk = nc.max_payload - 1024
    await nc.close()
    payload = make_payload()
    batches = [wire.make_chunks(wire.BatchKey("bench", 0, step, 0, 0, 0), payload, chunk)
               for step in range(args.batches)]
    rates = {"raw": [], "mmfeed": []}
    for _ in range(args.rounds):
        for mode in rates:
            rates[mode].append(await run_round(args.url, mode, batches, len(payload)))
    raw, mm = statistics.median(rates["raw"]), statistics.median(rates["mmfeed"])
    print(json.dumps({"raw_mb_per_s": raw, "mmfeed_mb_per_s": mm, "ratio": mm / raw,
                      "chunks_per_batch": len(batches[0]), "batch_bytes": len(payload),
                      "rounds": rates}))


if __name__ == "__main__":
    asyncio.run(main())
