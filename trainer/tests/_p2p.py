"""A recorder of every point-to-point op of a rank -- peer, shape, dtype, in program order --
and the check that both sides of each pair agree (docs/trainer.md, "Distributed checks").

gloo raises when a receive's byte count differs from its send; NCCL hangs or reads garbage,
and neither notices a shape or dtype mismatch of equal byte count. So every rank of a test
world records its sends and receives (``dist.send`` / ``dist.recv`` and each op of
``dist.batch_isend_irecv``: the mp feature exchange and the pipeline links), and
``mismatches`` checks that the sends of rank a to rank b are, one for one and in order, the
receives of b from a, with the same shape and dtype. Each op also records which
``batch_isend_irecv`` call posted it (``batch_calls``).
"""

from __future__ import annotations

import json
import os

import torch.distributed as dist


class Recorder:
    def __init__(self):
        self.ops: list[list] = []
        self.calls = 0

    def note(self, kind: str, tensor, peer: int, group=None, call: int = 0) -> None:
        """One op; ``call`` numbers the ``batch_isend_irecv`` call that posted it (0: a single
        send or receive), in program order; ``group`` its process group (None: the default),
        recorded as its member ranks: each group is a channel of its own."""
        members = "world" if group is None else ",".join(map(str, dist.get_process_group_ranks(group)))
        self.ops.append([kind, int(peer), list(tensor.shape), str(tensor.dtype), call, members])

    def begin(self) -> int:
        self.calls += 1
        return self.calls

    def dump(self, directory: str, rank: int) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
            json.dump(self.ops, f)


def _global(group, rank: int | None, group_rank: int | None) -> int:
    return rank if rank is not None else dist.get_global_rank(group, group_rank)


def install() -> Recorder:
    """Record this process's point-to-point ops from now on (wraps ``torch.distributed``)."""
    rec = Recorder()
    send, recv, batch = dist.send, dist.recv, dist.batch_isend_irecv

    def recorded_send(tensor, dst=None, group=None, tag=0, group_dst=None):
        rec.note("send", tensor, _global(group, dst, group_dst), group)
        return send(tensor, dst, group, tag, group_dst)

    def recorded_recv(tensor, src=None, group=None, tag=0, group_src=None):
        if src is None and group_src is None:
            raise AssertionError("p2p recorder: a receive from any source cannot be paired")
        rec.note("recv", tensor, _global(group, src, group_src), group)
        return recv(tensor, src, group, tag, group_src)

    def recorded_batch(ops):
        call = rec.begin()
        for op in ops:
            rec.note("send" if op.op is dist.isend else "recv", op.tensor, op.peer, op.group, call)
        return batch(ops)

    dist.send, dist.recv, dist.batch_isend_irecv = recorded_send, recorded_recv, recorded_batch
    return rec


def mismatches(directory: str, world: int) -> tuple[list[str], int]:
    """(every disagreement between the two sides of a pair, the number of ops checked)."""
    ops = {}
    for r in range(world):
        with open(os.path.join(directory, f"rank{r}.json")) as f:
            ops[r] = json.load(f)
    out, total = [], 0
    channels = sorted({op[5] for r in ops for op in ops[r]})
    for a in range(world):
        for b in range(world):
            for ch in channels:
                sent = [(shape, dtype) for kind, peer, shape, dtype, _, g in ops[a] if kind == "send" and peer == b and g == ch]
                got = [(shape, dtype) for kind, peer, shape, dtype, _, g in ops[b] if kind == "recv" and peer == a and g == ch]
                total += len(sent)
                where = f"rank {a} -> {b}" + ("" if ch == "world" else f" (group {ch})")
                if len(sent) != len(got):
                    out.append(f"{where}: sends {len(sent)} tensors, receives {len(got)}")
                out += [f"{where}, op {i}: sends {s}, receives {g}" for i, (s, g) in enumerate(zip(sent, got)) if s != g]
    return out, total



def batch_calls(directory: str, rank: int) -> list[list]:
    """The ops ([kind, peer, shape, dtype, call, group]) of each ``batch_isend_irecv`` call of
    ``rank``, in program order."""
    with open(os.path.join(directory, f"rank{rank}.json")) as f:
        ops = json.load(f)
    calls: dict[int, list] = {}
    for op in ops:
        if op[4] > 0:
            calls.setdefault(op[4], []).append(op)
    return list(calls.values())
