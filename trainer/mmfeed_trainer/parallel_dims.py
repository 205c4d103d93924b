"""The 2-D (dp, mp) device mesh layout, validated against the world size."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

DP = "dp"
"""Mesh axis of data parallelism (ranks hold different samples; gradients are summed)."""
MP = "mp"
"""Mesh axis of modality parallelism (mp rank 0: vision + fusion + losses, mp rank 1: text)."""

ROLE_FULL = "full"
ROLE_VISION = "vision"
ROLE_TEXT = "text"


@dataclass(kw_only=True, slots=True)
class ParallelDims:
    """World layout: ``dp`` data-parallel replicas x ``mp`` modality-parallel ranks.

    Global rank r sits at mesh coordinate (r // mp, r % mp): the mp ranks of one dp replica
    are adjacent (same node with torchrun), so the feature exchange stays intra-node.
    """

    dp: int = 1
    """Data-parallel degree (>= 1)."""
    mp: int = 1
    """Modality-parallel degree: 1 (whole model per rank) or 2 (vision | text)."""
    world_size: int = 1
    """Number of processes; must equal dp * mp."""
    fsdp: bool = False
    """Shard parameters over dp with FSDP2 ``fully_shard`` instead of replicating them (DDP)."""
    mesh: object = field(default=None, repr=False)
    """The torch DeviceMesh once ``build_mesh`` ran (None in a single process)."""

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ValueError(f"parallel dims: dp must be >= 1, got {self.dp}")
        if self.mp not in (1, 2):
            raise ValueError(f"parallel dims: mp must be 1 or 2, got {self.mp}. mp is modality parallelism: "
                             f"mp 2 runs the vision tower + fusion on one rank and the text tower on the "
                             f"other; there is no third part to place, and tensor parallelism inside a "
                             f"tower (mp > 2) is not implemented. To fit a larger model use --fsdp "
                             f"(shard over dp), --ac full, --mixed-precision or --cpu-offload")
        if self.dp * self.mp != self.world_size:
            raise ValueError(f"parallel dims: dp ({self.dp}) * mp ({self.mp}) = {self.dp * self.mp} "
                             f"!= world size {self.world_size}; launch dp*mp processes "
                             f"(torchrun --nproc-per-node {self.dp * self.mp}) or change --dp/--mp")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def build_mesh(self, device_type: str):
        """Create the (dp, mp) DeviceMesh over the initialised default process group."""
        from torch.distributed.device_mesh import init_device_mesh
        if self.distributed and self.mesh is None:
            self.mesh = init_device_mesh(device_type, (self.dp, self.mp), mesh_dim_names=(DP, MP))
        return self.mesh

    def coords(self) -> tuple[int, int]:
        """(dp rank, mp rank) of this process."""
        if not self.distributed:
            return 0, 0
        rank = dist.get_rank()
        return rank // self.mp, rank % self.mp

    @property
    def dp_rank(self) -> int:
        return self.coords()[0]

    @property
    def mp_rank(self) -> int:
        return self.coords()[1]

    @property
    def role(self) -> str:
        """ROLE_FULL for mp = 1, else ROLE_VISION (mp rank 0) or ROLE_TEXT (mp rank 1)."""
        if self.mp == 1:
            return ROLE_FULL
        return ROLE_VISION if self.mp_rank == 0 else ROLE_TEXT

    @property
    def has_loss(self) -> bool:
        """Whether this rank computes the losses (it holds the fusion block)."""
        return self.role != ROLE_TEXT

    def dp_group(self):
        """Process group over dp (ranks sharing this mp rank), or None without dp."""
        if self.mesh is None or self.dp == 1:
            return None
        return self.mesh.get_group(DP)

    def mp_group(self):
        """Process group over mp (the ranks of this dp replica), or None without mp."""
        if self.mesh is None or self.mp == 1:
            return None
        return self.mesh.get_group(MP)

    def dp_mesh(self):
        """1-D sub-mesh over dp (for FSDP2), or None without dp."""
        if self.mesh is None or self.dp == 1:
            return None
        return self.mesh[DP]

    def peer(self) -> int:
        """Global rank of the other mp rank of this dp replica (mp = 2 only)."""
        assert self.mp == 2, "peer() needs mp = 2"
        rank = dist.get_rank()
        return rank + 1 if self.mp_rank == 0 else rank - 1


def backend_for(device: torch.device) -> str:
    """nccl on CUDA, gloo on CPU: the same code path otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"
