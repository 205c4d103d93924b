"""The sharding plan of ``parallelize`` at scale, on one CPU: the base model on the ``meta``
device (no memory), a fake process group (``torch.testing._internal.distributed.fake_pg``,
backend "fake": collectives return at once) standing in for a 16-rank world.

dp 8 x mp 2 (FSDP2, bf16 mixed precision, selective AC) and dp 4 x pp 4 (FSDP2, mixed
precision, full AC): for a few ranks of each layout, which parts the rank holds, which
modules are FSDP units, and that every parameter is a DTensor sharded on dim 0 over exactly
this rank's dp group, with this rank's chunk, kept in fp32 (bf16 only in compute), with the
model's parameter names (docs/trainer.md, "Distributed checks").
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from mmfeed_trainer.parallel import blockwrap
from mmfeed_trainer.models import config
from mmfeed_trainer.models.model import MMModel
from mmfeed_trainer.parallel.parallel_dims import ParallelDims
from mmfeed_trainer.parallel.parallelize import ROLE_PARTS, ParallelConfig, parallelize
from mmfeed_trainer.parallel.pp.stage import parallelize_pipeline, stage_blocks

META = torch.device("meta")
WORLD = 16


@pytest.fixture
def fake_world():
    """``init(rank)`` joins a fake 16-rank world as ``rank`` (one at a time)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")

    def init(rank: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


def _base_on_meta() -> tuple[MMModel, dict[str, torch.Size]]:
    with torch.device(META):
        model = MMModel(config.model_config("base"))
    return model, {n: p.shape for n, p in model.named_parameters()}


def _chunk(n: int, parts: int, index: int) -> int:
    """Rows of dim 0 that FSDP2's shard ``index`` of ``parts`` holds (torch.chunk)."""
    chunks = torch.arange(n).chunk(parts)
    return len(chunks[index]) if index < len(chunks) else 0


def _check_shards(module, shapes: dict, dims: ParallelDims, want_names: set[str]) -> None:
    rank = dist.get_rank()
    group = [r for r in range(WORLD) if r % (dims.pp * dims.mp) == rank % (dims.pp * dims.mp)]
    params = dict(module.named_parameters())
    assert set(params) == want_names
    for name, p in params.items():
        assert isinstance(p, DTensor), f"{name}: not sharded"
        assert p.placements == (Shard(0),), f"{name}: {p.placements}"
        assert p.device_mesh.mesh.tolist() == group, f"{name}: mesh {p.device_mesh.mesh.tolist()}, dp group {group}"
        assert p.shape == shapes[name] and p.dtype == torch.float32, f"{name}: {p.shape} {p.dtype}"
        local = p.to_local()
        assert local.device == META
        assert local.shape[0] == _chunk(shapes[name][0], dims.dp, dims.dp_rank), f"{name}: local {local.shape}"


def _check_policies(module, n_blocks: int, ac: str) -> None:
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        policy = unit._get_fsdp_state()._mp_policy
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert module._get_fsdp_state()._mp_policy.output_dtype == torch.float32  # the root: fp32 out
    found = blockwrap.blocks(module)
    assert len(found) == n_blocks
    assert all(isinstance(b, FSDPModule) and hasattr(b.forward, "__wrapped__") for b in found), f"{ac} AC"


@pytest.mark.parametrize("rank", [0, 1, 15])
def test_dp8_mp2_fsdp_plan(fake_world, rank):
    fake_world(rank)
    dims = ParallelDims(dp=8, mp=2, world_size=WORLD, fsdp=True)
    dims.build_mesh("cpu")
    model, shapes = _base_on_meta()
    mcfg = model.cfg
    module = parallelize(model, dims=dims, device=META,
                         cfg=ParallelConfig(fsdp=True, mixed_precision=True, ac="selective"))
    role = "vision" if rank % 2 == 0 else "text"
    assert (dims.role, dims.dp_rank) == (role, rank // 2)
    parts = ROLE_PARTS[role]
    _check_shards(module, shapes, dims, {n for n in shapes if n.split(".")[0] in parts})
    blocks = {"vision": mcfg.vision_layers + mcfg.fusion_layers, "text": mcfg.text_layers}[role]
    _check_policies(module, blocks, "selective")
    towers = {n for n, m in module.named_modules() if isinstance(m, FSDPModule) and "." not in n}
    assert towers == {""} | {p for p in parts if p != "itc"}  # root + one unit per tower


@pytest.mark.parametrize("rank", [0, 5, 15])
def test_dp4_pp4_fsdp_plan(fake_world, rank):
    fake_world(rank)
    dims = ParallelDims(dp=4, pp=4, world_size=WORLD, fsdp=True)
    dims.build_mesh("cpu")
    model, shapes = _base_on_meta()
    mcfg = model.cfg
    module = parallelize_pipeline(model, dims=dims, device=META,
                                  cfg=ParallelConfig(fsdp=True, mixed_precision=True, ac="full"))
    stage = rank % 4
    assert (dims.pp_rank, dims.dp_rank) == (stage, rank // 4)
    vis, txt = stage_blocks(mcfg, 4)
    keep_v, keep_t = vis[stage], txt[stage]
    assert list(module.vision.blocks) == [str(i) for i in keep_v]
    assert list(module.text.blocks) == [str(i) for i in keep_t]

    def held(name: str) -> bool:
        part, rest = name.split(".")[0], name.split(".")[1:]
        if part in ("fusion", "itc"):
            return stage == 3
        if rest[0] == "blocks":
            return int(rest[1]) in (keep_v if part == "vision" else keep_t)
        head = rest[0] in ("norm", "proj")
        return stage == 3 if head else stage == 0  # embeddings on stage 0, heads on the last

    _check_shards(module, shapes, dims, {n for n in shapes if held(n)})
    _check_policies(module, len(keep_v) + len(keep_t) + (mcfg.fusion_layers if stage == 3 else 0), "full")
    # Under pp the gathered parameters stay from forward to backward (ZeRO-2, as torchtitan):
    # 1F1B would gather them again for every micro-batch's forward and backward.
    groups = [m._get_fsdp_state()._fsdp_param_group for m in module.modules() if isinstance(m, FSDPModule)]
    groups = [g for g in groups if g is not None]
    assert groups and all(g.post_forward_mesh_info is None for g in groups)
