"""The distributed checks themselves bite (docs/trainer.md, "Distributed checks on the CPU"):
the point-to-point recorder (``_p2p``) reports a send and a receive of the same byte count
but another shape, which gloo lets through (NCCL would read garbage); under
TORCH_DISTRIBUTED_DEBUG=DETAIL a collective whose shapes differ across ranks raises on
every rank ("Detected mismatch between collectives"), where without it gloo hangs (measured:
the world ran into its deadline) and so would NCCL. The same 2-rank world checks that the
step's dp size table is exchanged as host tensors over a gloo group (``_dp_sizes``)."""

import json
import os

import torch
import torch.distributed as dist

import _p2p
from _dist import run_world
from mmfeed_trainer.data.batches import Batch
from mmfeed_trainer.parallel.parallel_dims import DP, ParallelDims
from mmfeed_trainer.parallel.step import _dp_sizes


def _host_sizes(rank, outdir):
    """The dp size table goes over a host (gloo) group: here with the device the meta one,
    which a collective cannot take, and over the gloo twins a CUDA mesh gets."""
    dims = ParallelDims(dp=2, world_size=2)
    dims.build_mesh("cpu")
    mbs = [Batch(ids=["x"] * n, step=0, micro_batch=i, weight=torch.ones(n), num_live=n)
           for i, n in enumerate([(3, 5), (2, 4)][rank])]
    got = [_dp_sizes(mbs, dims, torch.device("meta"))]
    dims.host = dims.host_groups()
    got.append(_dp_sizes(mbs, dims, torch.device("meta")))
    ranks = dist.get_process_group_ranks(dims.host_group(DP))
    with open(os.path.join(outdir, f"sizes{rank}.json"), "w") as f:
        json.dump({"sizes": got, "ranks": ranks, "backend": dist.get_backend(dims.host_group(DP))}, f)


def _worker(rank, world, outdir):
    _host_sizes(rank, outdir)
    if rank == 0:
        dist.send(torch.zeros(2, 3), dst=1)
        dist.send(torch.zeros(4, dtype=torch.int64), dst=1)
    else:
        dist.recv(torch.empty(3, 2), src=0)  # same bytes, another shape: gloo accepts it
        dist.recv(torch.empty(4, dtype=torch.int64), src=0)
    try:  # DETAIL checks the shapes of a collective across ranks before running it
        dist.all_reduce(torch.zeros(2 + rank))
        caught = ""
    except RuntimeError as err:
        caught = str(err)
    with open(os.path.join(outdir, f"detail{rank}.json"), "w") as f:
        json.dump(caught, f)


def test_recorder_and_detail_catch_mismatches(tmp_path):
    run_world(_worker, 2, args=(str(tmp_path),), timeout=120, p2p_dir=str(tmp_path / "p2p"), debug="DETAIL")
    found, total = _p2p.mismatches(str(tmp_path / "p2p"), 2)
    assert total == 2
    assert found == ["rank 0 -> 1, op 0: sends ([2, 3], 'torch.float32'), receives ([3, 2], 'torch.float32')"]
    for rank in (0, 1):
        sizes = json.loads((tmp_path / f"sizes{rank}.json").read_text())
        assert sizes == {"sizes": [[[3, 2], [5, 4]]] * 2, "ranks": [0, 1], "backend": "gloo"}
        caught = json.loads((tmp_path / f"detail{rank}.json").read_text())
        assert caught.startswith("Detected mismatch between collectives"), f"rank {rank}: {caught!r}"


class _Mesh:
    def __init__(self, shape, names):
        self.mesh = torch.arange(16).reshape(shape)
        self.mesh_dim_names = names


def test_host_groups_twin_the_mesh_axes(monkeypatch):
    """``host_groups`` creates, on every rank and in one order, a gloo group per dp, pp and mp
    group of the mesh (what a CUDA mesh gets), and keeps this rank's."""
    made = []
    monkeypatch.setattr(dist, "new_group", lambda ranks, backend=None: made.append((ranks, backend)) or len(made))
    monkeypatch.setattr(dist, "get_rank", lambda: 6)
    dims = ParallelDims(dp=8, mp=2, world_size=16)
    dims.mesh = _Mesh((8, 2), ("dp", "mp"))
    got = dims.host_groups()
    dp_groups = [[m + 2 * d for d in range(8)] for m in range(2)]
    mp_groups = [[2 * d, 2 * d + 1] for d in range(8)]
    assert made == [(g, "gloo") for g in dp_groups + mp_groups]
    assert got == {"dp": 1, "mp": 2 + 4}  # rank 6: dp group of mp rank 0, mp group of dp rank 3
    made.clear()
    dims = ParallelDims(dp=4, pp=4, world_size=16)
    dims.mesh = _Mesh((4, 4, 1), ("dp", "pp", "mp"))
    got = dims.host_groups()
    assert made == ([([p + 4 * d for d in range(4)], "gloo") for p in range(4)]  # no mp axis
                    + [([4 * d + p for p in range(4)], "gloo") for d in range(4)])
    assert got == {"dp": 3, "pp": 4 + 2}  # rank 6: stage 2 of dp replica 1
