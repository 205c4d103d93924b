"""Where reading resumes: ``Position``, the next (epoch, step, micro-batch) of the plan and
the plan's hash, and its two plain-dict forms.

* ``to_dict()`` / ``from_dict()``: the source position -- ``{"epoch", "next_step"}``, plus
  ``"plan_hash"`` when the source knows its plan (the stream) -- which a source's
  ``position()`` reports, the trainer's checkpoint JSON stores under ``"stream"`` and
  ``register``/``steps`` read. Missing keys read as the start (epoch 0, step 0).
* ``state()`` / ``from_state()``: the dataset state of ``data.StreamDataset.state_dict()``
  -- ``{"version", "epoch", "next_step", "next_micro_batch", "plan_hash"}`` -- validated on
  load (a wrong version or a negative position is a ValueError).

Both forms are plain JSON/picklable values, unchanged from the untyped dicts they replace,
so checkpoints written before this type read the same.
"""

from __future__ import annotations

from dataclasses import dataclass

STATE_VERSION = 1
"""Version of the dataset ``state()`` form."""


@dataclass(slots=True)
class Position:
    epoch: int = 0
    next_step: int = 0
    """Step within ``epoch``."""
    next_micro_batch: int = 0
    """Micro-batch within ``next_step`` (datasets hand out single micro-batches; sources whole steps)."""
    plan_hash: str | None = None
    """The plan the position is in; None for a source without plans (shards, synthetic)."""

    def to_dict(self) -> dict:
        """The source / checkpoint form (``next_micro_batch`` is not part of it)."""
        out = {"epoch": self.epoch, "next_step": self.next_step}
        if self.plan_hash is not None:
            out["plan_hash"] = self.plan_hash
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> Position:
        d = d or {}
        plan = d.get("plan_hash")
        return cls(epoch=d.get("epoch", 0), next_step=d.get("next_step", 0),
                   plan_hash=str(plan) if plan is not None else None)

    def state(self, **extra) -> dict:
        """The dataset state form."""
        return {"version": STATE_VERSION, "epoch": self.epoch, "next_step": self.next_step,
                "next_micro_batch": self.next_micro_batch, "plan_hash": self.plan_hash or "", **extra}

    @classmethod
    def from_state(cls, state: dict) -> Position:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"data: state version {state.get('version')!r}, want {STATE_VERSION}")
        values = [state.get(k) for k in ("epoch", "next_step", "next_micro_batch")]
        if not all(isinstance(v, int) and v >= 0 for v in values):
            raise ValueError(f"data: state position {values} must be ints >= 0")
        return cls(*values, plan_hash=str(state.get("plan_hash", "")))

    def handed_out(self, item: dict, micro_batches: int) -> None:
        """Advance past ``item`` (a micro-batch with ``epoch``, ``step``, ``micro_batch``) of a
        step of ``micro_batches``."""
        self.epoch, self.next_step, self.next_micro_batch = item["epoch"], item["step"], item["micro_batch"] + 1
        if self.next_micro_batch >= micro_batches:
            self.next_step, self.next_micro_batch = self.next_step + 1, 0

    def skips(self, item: dict) -> bool:
        """True for an item before the position (already handed out)."""
        return (item["epoch"], item["step"], item["micro_batch"]) < (self.epoch, self.next_step, self.next_micro_batch)
