"""What the framework modules share: checks of the world and of the items."""

from __future__ import annotations

import os


def check_world(kind: str, processes: int, dataset, hint: str) -> None:
    """ValueError unless the framework runs as many processes as torchrun started, and the
    dataset was made for that world (a framework that falls back to one process per rank
    trains ranks apart: different parameters, several checkpoints)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if processes != world:
        raise ValueError(f"{kind}: {processes} process(es) in the framework's world but WORLD_SIZE={world}: "
                         f"the ranks would train apart; {hint}")
    if getattr(dataset, "world_size", world) != world:
        raise ValueError(f"{kind}: the dataset is for a world of {dataset.world_size}, torchrun started {world}")


def check_item(kind: str, item: dict) -> None:
    """ValueError for an item of a step of several micro-batches: these integrations train one
    micro-batch per optimizer step (``weighted_loss`` normalises each by its own weight)."""
    if item.get("micro_batches", 1) != 1:
        raise ValueError(f"{kind}: a step of {item['micro_batches']} micro-batches; serve with --micro-batches 1 "
                         f"(one micro-batch per optimizer step)")
