"""Helpers to run a function on a CPU gloo world of several processes, with a deadline."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list:
    """n distinct free loopback ports: every socket stays bound until all are chosen, so the
    kernel cannot hand the same port out twice (closing each one first allowed that)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _entry(rank: int, world: int, port: int, fn, args, p2p_dir: str | None, debug: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug
        dist.set_debug_level_from_env()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    recorder = None
    if p2p_dir:
        import _p2p
        recorder = _p2p.install()
    try:
        fn(rank, world, *args)
        dist.barrier()
        if recorder is not None:
            recorder.dump(p2p_dir, rank)
    finally:
        dist.destroy_process_group()


def run_world(fn, world: int, args: tuple = (), timeout: float = 120.0, *, p2p_dir: str | None = None,
              debug: str | None = None) -> None:
    """Run fn(rank, world, *args) in ``world`` spawned processes; raise on failure or timeout.
    ``p2p_dir``: every rank records its point-to-point ops there (``_p2p``); ``debug``: the
    ranks' TORCH_DISTRIBUTED_DEBUG ("DETAIL": collective shapes and order checked across ranks)."""
    ctx = mp.start_processes(_entry, args=(world, free_port(), fn, args, p2p_dir, debug), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"world of {world} processes did not finish in {timeout:.0f} s")
