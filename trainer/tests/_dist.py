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


def _entry(rank: int, world: int, port: int, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_world(fn, world: int, args: tuple = (), timeout: float = 120.0) -> None:
    """Run fn(rank, world, *args) in ``world`` spawned processes; raise on failure or timeout."""
    ctx = mp.start_processes(_entry, args=(world, free_port(), fn, args), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"world of {world} processes did not finish in {timeout:.0f} s")
