"""Where a rank's micro-batches come from: shard files, synthetic, or the NATS stream.

A source yields ``StepData`` -- all micro-batch records of one step for this rank, in
micro-batch order -- from a position ``{"epoch": e, "next_step": s}`` on (resume; the dict
form of ``position.Position``). ``ack(data)`` is called after the step's update has been
applied and advances ``position()`` (a ``Position``), which a checkpoint stores; ``feedback`` follows every step. Sources are used
from one thread (the prefetcher's), except ``ack``, ``feedback``, ``position`` and ``close``,
which the training thread calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from .. import keys
from . import synthetic
from .position import Position
from .shardset import MANIFEST, ShardSet

START = {"epoch": 0, "next_step": 0}


@dataclass(slots=True)
class StepData:
    step: int
    """Step within the epoch."""
    records: list[pa.RecordBatch]
    handles: list = field(default_factory=list)
    """Source-specific acknowledgement handles (NATS messages)."""
    epoch: int = 0


class Source:
    """Base: tracks the position; no acknowledgement, no feedback."""

    def __init__(self):
        self._position = Position.from_dict(START)

    def steps(self, position: dict) -> Iterator[StepData]:
        raise NotImplementedError

    def ack(self, data: StepData) -> None:
        self._position = Position(data.epoch, data.step + 1)

    def feedback(self, data: StepData, *, compute_seconds: float, data_wait_seconds: float, samples: int) -> None:
        pass

    def position(self) -> Position:
        """Where to resume after the last acknowledged step (a copy)."""
        return Position(self._position.epoch, self._position.next_step)

    def wait_bound_s(self) -> float | None:
        """The longest ``steps`` may take to produce the next step before the prefetcher gives
        up on it (``prefetch.Prefetcher.next``); None: no bound (local data)."""
        return None

    def data_vocab(self) -> int | None:
        """The vocabulary size of the tokenizer that made the data's ids (the
        ``mmfeed.vocab_size`` schema metadata), known before the first step; None when unknown."""
        return None

    def close(self) -> None:
        pass


def group_by_step(records: Iterator[pa.RecordBatch], start_step: int) -> Iterator[StepData]:
    """Group consecutive records with the same ``step`` column; skip steps < start_step.

    Raises ValueError when steps go backwards or micro-batches are out of order."""
    current: StepData | None = None
    last_step = -1
    for rec in records:
        if rec.num_rows == 0:
            raise ValueError("source: empty record batch (ranks must get padding samples instead)")
        step = rec.column(rec.schema.get_field_index("step"))[0].as_py()
        mb = rec.column(rec.schema.get_field_index("micro_batch"))[0].as_py()
        if step < last_step:
            raise ValueError(f"source: step {step} after step {last_step}: records out of order")
        last_step = step
        if step < start_step:
            continue
        if current is not None and current.step != step:
            yield current
            current = None
        if current is None:
            current = StepData(step, [])
        if mb != len(current.records):
            raise ValueError(f"source: step {step} micro-batch {mb} arrived as number {len(current.records)}")
        current.records.append(rec)
    if current is not None:
        yield current


class ShardSource(Source):
    """Reads one dp rank of an ``mmfeed shard`` output: a folder or URL (``s3://``, ``gs://``,
    ``file://``; see ``shardset``).

    A set with ``shard.json`` holds samples once and one index per epoch: ``steps`` yields the
    epoch of the position from its ``next_step``, then the following stored epochs, so a
    trainer runs every epoch the set was planned for. A folder of ``rank-%05d.arrow`` files
    without a manifest (older sets) is one epoch, read as it is. Both mp ranks of a dp replica
    read the same rows; ``batches.record_to_batch`` keeps the columns of the rank's role.
    Local files are memory-mapped; JPEG sets keep their JPEG pixels, which the prefetcher
    decodes on the trainer's device (``jpegwire``).
    """

    def __init__(self, directory: str, dp_rank: int):
        super().__init__()
        self.dp_rank = dp_rank
        self.set: ShardSet | None = None
        if "://" in directory or os.path.exists(os.path.join(directory, MANIFEST)):
            self.set = ShardSet(directory, decode=False)
            if not 0 <= dp_rank < self.set.manifest["dp"]:
                raise ValueError(f"shards: {directory} has {self.set.manifest['dp']} dp ranks, not rank {dp_rank}")
            return
        self.path = os.path.join(directory, f"rank-{dp_rank:05d}.arrow")
        if not os.path.exists(self.path):
            raise ValueError(f"shards: {self.path} does not exist (is --shards the mmfeed shard output "
                             f"directory, and does it have a file per dp rank?)")

    def data_vocab(self) -> int | None:
        """From the schema metadata of the first data file (every file carries the same)."""
        if self.set is not None:
            if not self.set.files:
                return None
            schema = self.set.schema(0)
        else:
            with pa.memory_map(self.path) as source:
                schema = pa.ipc.open_file(source).schema
        raw = (schema.metadata or {}).get(keys.META_VOCAB_SIZE.encode())
        try:
            return None if raw is None else int(raw)
        except ValueError:
            raise ValueError(f"shards: schema metadata {keys.META_VOCAB_SIZE}={raw!r} is not an integer") from None

    def _records(self) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(self.path) as source:
            reader = pa.ipc.open_file(source)
            version = (reader.schema.metadata or {}).get(keys.META_SCHEMA_VERSION.encode(), b"1")
            if version != keys.SCHEMA_VERSION.encode():
                raise ValueError(f"shards: {self.path} has schema version {version!r}, want {keys.SCHEMA_VERSION}")
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def epochs(self) -> list[int]:
        """The epochs the set holds."""
        return sorted(self.set.epochs) if self.set else [0]

    def steps(self, position: dict) -> Iterator[StepData]:
        """The steps from ``position`` to the end of the last stored epoch."""
        if self.set is None:
            return group_by_step(self._records(), position.get("next_step", 0))
        return self._indexed(position.get("epoch", min(self.set.epochs)), position.get("next_step", 0))

    def _indexed(self, epoch: int, start: int) -> Iterator[StepData]:
        for e in [e for e in sorted(self.set.epochs) if e >= epoch] or [epoch]:
            for step, records in self.set.rank_steps(e, self.dp_rank, start if e == epoch else 0):
                yield StepData(step, records, epoch=e)


class SyntheticSource(Source):
    """Endless deterministic synthetic steps for one dp rank (``synthetic.py``)."""

    def __init__(self, cfg: synthetic.SynthConfig, dp_rank: int):
        super().__init__()
        self.cfg = cfg
        self.dp_rank = dp_rank

    def steps(self, position: dict) -> Iterator[StepData]:
        step = position.get("next_step", 0)
        cache: dict[int, list[pa.RecordBatch]] = {}
        while True:
            if self.cfg.distinct_steps > 0:
                key = step % self.cfg.distinct_steps
                if key not in cache:
                    cache[key] = synthetic.step_records(self.cfg, key, self.dp_rank)
                records = cache[key]
            else:
                records = synthetic.step_records(self.cfg, step, self.dp_rank)
            yield StepData(step, records)
            step += 1
