"""The (dp, pp, mp) device mesh layout, validated against the world size."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

DP = "dp"
"""Mesh axis of data parallelism (ranks hold different samples; gradients are summed)."""
MP = "mp"
"""Mesh axis of modality parallelism (mp rank 0: vision + fusion + losses, mp rank 1: text)."""
PP = "pp"
"""Mesh axis of pipeline parallelism (stage 0 embeds and receives the data, the last stage
runs the fusion and the losses; ``parallel.pp``)."""

ROLE_FULL = "full"
ROLE_VISION = "vision"
ROLE_TEXT = "text"


@dataclass(kw_only=True, slots=True)
class ParallelDims:
    """World layout: ``dp`` data-parallel replicas x ``pp`` pipeline stages x ``mp``
    modality-parallel ranks.

    Global rank r sits at mesh coordinate (r // (pp·mp), (r // mp) % pp, r % mp): the stages
    and mp ranks of one dp replica are adjacent (same node with torchrun), so the feature
    exchange and the stage-to-stage sends stay intra-node.
    """

    dp: int = 1
    """Data-parallel degree (>= 1)."""
    mp: int = 1
    """Modality-parallel degree: 1 (whole model per rank) or 2 (vision | text)."""
    pp: int = 1
    """Pipeline stages (>= 1; > 1 needs mp = 1): each tower's blocks split over the stages."""
    world_size: int = 1
    """Number of processes; must equal dp * pp * mp."""
    fsdp: bool = False
    """Shard parameters over dp with FSDP2 ``fully_shard`` instead of replicating them (DDP)."""
    mesh: object = field(default=None, repr=False)
    """The torch DeviceMesh once ``build_mesh`` ran (None in a single process)."""
    host: dict = field(default_factory=dict, repr=False)
    """On a device mesh: per axis (DP, MP), this rank's gloo group over the same ranks
    (``host_group``); empty on the CPU, where the mesh's own groups are gloo."""

    def __post_init__(self) -> None:
        if self.dp < 1:
            raise ValueError(f"parallel dims: dp must be >= 1, got {self.dp}")
        if self.mp not in (1, 2):
            raise ValueError(f"parallel dims: mp must be 1 or 2, got {self.mp}. mp is modality parallelism: "
                             f"mp 2 runs the vision tower + fusion on one rank and the text tower on the "
                             f"other; there is no third part to place, and tensor parallelism inside a "
                             f"tower (mp > 2) is not implemented. To fit a larger model use --fsdp "
                             f"(shard over dp), --ac full, --mixed-precision or --cpu-offload")
        if self.pp < 1:
            raise ValueError(f"parallel dims: pp must be >= 1, got {self.pp}")
        if self.pp > 1 and self.mp != 1:
            raise ValueError(f"parallel dims: pp {self.pp} with mp {self.mp}: pipeline stages split each "
                             f"tower's blocks over pp ranks and need mp = 1 (the modality split and the "
                             f"stage split are two answers to the same memory problem; pick one)")
        n = self.dp * self.pp * self.mp
        if n != self.world_size:
            pp = f" * pp ({self.pp})" if self.pp > 1 else ""
            raise ValueError(f"parallel dims: dp ({self.dp}){pp} * mp ({self.mp}) = {n} "
                             f"!= world size {self.world_size}; launch dp*{'pp*' if pp else ''}mp processes "
                             f"(torchrun --nproc-per-node {n}) or change --dp/--mp{'/--pp' if pp else ''}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def build_mesh(self, device_type: str):
        """Create the (dp, mp) DeviceMesh, or (dp, pp, mp) with pp > 1, over the initialised
        default process group."""
        from torch.distributed.device_mesh import init_device_mesh
        if self.distributed and self.mesh is None:
            if self.pp > 1:
                self.mesh = init_device_mesh(device_type, (self.dp, self.pp, self.mp), mesh_dim_names=(DP, PP, MP))
            else:
                self.mesh = init_device_mesh(device_type, (self.dp, self.mp), mesh_dim_names=(DP, MP))
            if device_type != "cpu":
                self.host = self.host_groups()
        return self.mesh

    def host_groups(self) -> dict:
        """gloo twins of the mesh's dp, pp and mp groups: {axis: this rank's group}. Collective
        over the world (every rank creates every group, in the same order)."""
        ranks = self.mesh.mesh
        out = {}
        for axis in (DP, PP, MP):
            if axis not in self.mesh.mesh_dim_names:
                continue
            dim = self.mesh.mesh_dim_names.index(axis)
            size = ranks.shape[dim]
            if size == 1:
                continue
            for members in ranks.movedim(dim, -1).reshape(-1, size).tolist():
                group = dist.new_group(members, backend="gloo")
                if dist.get_rank() in members:
                    out[axis] = group
        return out

    def host_group(self, axis: str):
        """A group over this rank's ``axis`` (DP, PP or MP) whose collectives take host tensors:
        the sizes a step exchanges (and the pipeline's message headers) go through it without
        touching the device (docs/trainer.md, "No host syncs in the step"). None without that
        axis."""
        group = {DP: self.dp_group, PP: self.pp_group, MP: self.mp_group}[axis]()
        return None if group is None else self.host.get(axis, group)

    def coords(self) -> tuple[int, int]:
        """(dp rank, mp rank) of this process."""
        if not self.distributed:
            return 0, 0
        rank = dist.get_rank()
        return rank // (self.pp * self.mp), rank % self.mp

    @property
    def pp_rank(self) -> int:
        """This process's pipeline stage (0 without pp)."""
        if not self.distributed:
            return 0
        return (dist.get_rank() // self.mp) % self.pp

    @property
    def first_stage(self) -> bool:
        """Whether this rank is pipeline stage 0: the only one that receives data."""
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        """Whether this rank is the last pipeline stage (fusion and losses)."""
        return self.pp_rank == self.pp - 1

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
        return self.role != ROLE_TEXT and self.last_stage

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

    def pp_group(self):
        """Process group over pp (the stages of this dp replica), or None without pp."""
        if self.mesh is None or self.pp == 1:
            return None
        return self.mesh.get_group(PP)

    def stage_rank(self, stage: int) -> int:
        """Global rank of pipeline stage ``stage`` of this dp replica (and mp rank)."""
        dp_rank, mp_rank = self.coords()
        return (dp_rank * self.pp + stage) * self.mp + mp_rank

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
