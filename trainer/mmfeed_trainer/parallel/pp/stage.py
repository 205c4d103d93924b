"""Pipeline parallelism (``pp``): each tower's blocks split over stages, an explicit 1F1B or
GPipe schedule over point-to-point sends that carry each micro-batch's shapes first.

Why not ``torch.distributed.pipelining``: its stages agree on the shapes of what travels
between them (they are inferred once, or given up front), while mmfeed micro-batches
differ from one slot to the next in sample count, padded caption length and patch grid,
and packed ones in token count. Padding every slot to the largest would throw away what
the balancer planned. So every forward message here is a fixed-size header (micro-batch
index, mode, then dtype and shape of each tensor) followed by the tensors; the backward
message needs no header (a stage knows the shapes of what it sent).

Layout (``PipelineStage``): stage 0 holds both towers' embeddings and its share of their
blocks; middle stages hold blocks only; the last stage holds its blocks, the towers' final
norms and projections, the fusion and the contrastive head, and computes the losses. The
blocks of each tower go to the stages in contiguous runs sized so that every stage does
about the same FLOPs (``stage_blocks``): the last stage, which also runs the fusion, and
the first, which also embeds, get fewer blocks. An even split of the blocks left the last
stage of the base model at 1.8-1.9x an even share at pp 4 (1.3x at pp 2), so the whole
pipeline ran at its pace; the FLOP-balanced split brings it to 1.1-1.25x (1.04-1.09x). Where
the fusion alone is more than a stage's share (base at pp 6 and more), the last stage stays
the slowest: keep pp at 4 or below for such models. Parameter names stay those of
``MMModel`` (a stage keeps its blocks in a ModuleDict keyed by their index in the tower), so
checkpoints and parity checks line up.

One step (``train_step``): stage 0 takes the step's micro-batches (the only stage that
receives data from the source), computes the global sample weight W and the per-micro-batch
sample counts of every dp rank (collectives over its dp group, as without pp) and
broadcasts (M, W, counts) over the pp group; every stage then runs the schedule's actions
F i / B i (``schedule``). One mmfeed micro-batch fills one slot. The last stage's losses
are divided by W, and its contrastive loss gathers embeddings over the dp group of the
last stages; all dp replicas run the same schedule, so those collectives pair up.
Gradients are summed over dp: FSDP2 (``fully_shard`` per block and on the stage; the
gradient sync is enabled for the last backward only) or, for DDP semantics, one
all-reduce of the flattened gradients after the schedule (DDP's reducer assumes the
forward and backward of a micro-batch are adjacent, which 1F1B breaks). The gradient norm
for clipping sums over dp shards (FSDP2) and the pp stages.

Communication is laid out to stay NCCL-safe (only gloo on CPU is tested here; no multi-GPU
machine was available): a send that the stage's next receive follows is posted with it in
one ``batch_isend_irecv`` group (send forward + receive backward in the 1F1B steady state,
as Megatron-LM pairs them), so two neighbours never both block in a send; a forward send
that another forward follows (the warm-up; every forward of stage 0) is posted at once, so
the next stage does not wait for this one's warm-up. Headers and the step plan travel on
the pp host group (gloo) and the stages read them without a device sync; FSDP2 under pp
keeps the gathered parameters from forward to backward (``reshard_after_forward`` False by
default, as torchtitan).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .. import blockwrap
from ...models import losses
from ... import timing
from ...data.batches import Batch
from ...data.layout import fill, grid_layout
from ...models.model import MMModel, flops_parts, length_mask, segments
from ..optim import clip_grad_norm
from ..parallel_dims import PP, ParallelDims
from .link import WIRE_DTYPES, GRAD_KEYS, Link

SCHEDULES = ("1f1b", "gpipe")



def split_blocks(n: int, pp: int) -> list[range]:
    """Contiguous near-equal runs of n block indices over pp stages (earlier stages get the
    extra block). A stage may get none when n < pp."""
    base, extra = divmod(n, pp)
    out, start = [], 0
    for s in range(pp):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


# The sample the stage split is balanced for: a 224 px image at the model's patch size and a
# 32-token caption. Every stage gets the same share of both towers, so other shapes move only
# the fixed parts' share: base stays within 1.04-1.24x an even share at pp 2-4 from 32 + 196
# to 128 + 1024 tokens; tiny, whose fusion is a larger part, goes from 1.18x to 1.43x at pp 4.
SPLIT_IMAGE_PX, SPLIT_TEXT_TOKENS = 224, 32


def _runs(counts: list[int]) -> list[range]:
    out, start = [], 0
    for c in counts:
        out.append(range(start, start + c))
        start += c
    return out


def _apportion(n: int, shares: list[float]) -> list[int]:
    """n blocks over stages in proportion to shares (largest remainder, ties to the earlier
    stage); all to the even split when every share is 0."""
    total = sum(shares)
    if total <= 0:
        return [len(r) for r in split_blocks(n, len(shares))]
    raw = [n * x / total for x in shares]
    counts = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def stage_blocks(cfg, pp: int) -> tuple[list[range], list[range]]:
    """The vision and the text tower's block indices of each of ``pp`` stages: contiguous runs
    in tower order, sized so that the stages' training FLOPs (``model.flops_parts`` of the
    reference sample, SPLIT_*) are as equal as a proportional split makes them. Stage 0 also
    embeds, the last stage also runs the fusion: each stage gets blocks in proportion to what
    the level L leaves it after those fixed parts, L the level at which the blocks just fill
    the stages (water-filling), so a stage whose fixed part exceeds L gets none."""
    p = SPLIT_IMAGE_PX // cfg.patch_size
    f = flops_parts(cfg, SPLIT_TEXT_TOKENS, p * p)
    fixed = [0.0] * pp
    fixed[0] += f["patch_embed"]
    fixed[-1] += f["fusion"]
    blocks = cfg.vision_layers * f["vision_block"] + cfg.text_layers * f["text_block"]
    active = set(range(pp))
    while True:
        level = (blocks + sum(fixed[s] for s in active)) / len(active)
        full = {s for s in active if fixed[s] >= level}
        if not full or full == active:
            break
        active -= full
    shares = [max(level - fixed[s], 0.0) if s in active else 0.0 for s in range(pp)]
    return _runs(_apportion(cfg.vision_layers, shares)), _runs(_apportion(cfg.text_layers, shares))


def stage_flops(cfg, text_tokens: int, image_tokens: int, pp: int) -> list[float]:
    """Training FLOPs of one sample on each of ``pp`` stages (``model.flops_parts``): every
    stage its ``stage_blocks`` share of each tower, the first also the patch embedding, the
    last also the fusion. They sum to ``model.flops_per_sample``."""
    f = flops_parts(cfg, text_tokens, image_tokens)
    vis, txt = stage_blocks(cfg, pp)
    out = []
    for s in range(pp):
        fwd = len(vis[s]) * f["vision_block"] + len(txt[s]) * f["text_block"]
        fwd += (f["patch_embed"] if s == 0 else 0) + (f["fusion"] if s == pp - 1 else 0)
        out.append(3.0 * fwd)
    return out


def schedule(kind: str, pp: int, stage: int, micro_batches: int) -> list[tuple[str, int]]:
    """The actions ("F" | "B", micro-batch) of ``stage`` in one step.

    gpipe: every forward, then every backward (in micro-batch order). 1f1b: min(pp - stage
    - 1, M) warm-up forwards, then alternately one forward and one backward, then the
    remaining backwards: at most pp - stage micro-batches are in flight on a stage (GPipe
    holds M), with the same bubble. The last action is always B of the last micro-batch."""
    m = micro_batches
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if kind != "1f1b":
        raise ValueError(f"pipeline: schedule {kind!r}, want one of {SCHEDULES}")
    warm = min(pp - stage - 1, m)
    acts = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        acts += [("F", warm + i), ("B", i)]
    return acts + [("B", i) for i in range(m - warm, m)]


def _trim(tower: nn.Module, keep: range, *, first: bool, last: bool, embed: tuple[str, ...],
          head: tuple[str, ...]) -> nn.Module:
    """Drop from ``tower`` (in place) the blocks outside ``keep`` and, unless this is the
    first (last) stage, its embedding (head) parts; the names of what stays are unchanged."""
    tower.blocks = nn.ModuleDict({str(i): tower.blocks[i] for i in keep})
    for name in (() if first else embed) + (() if last else head):
        setattr(tower, name, None)
    return tower


class PipelineStage(nn.Module):
    """Stage ``stage`` of ``pp`` of an ``MMModel`` (which it takes apart: build one model per
    rank). ``forward`` takes a micro-batch (stage 0) or the previous stage's carry and returns
    the carry for the next stage, or on the last stage the loss inputs."""

    def __init__(self, model: MMModel, stage: int, pp: int):
        super().__init__()
        if pp < 2 or not 0 <= stage < pp:
            raise ValueError(f"pipeline stage: stage {stage} of pp {pp} (pp must be >= 2)")
        cfg = model.cfg
        self.stage, self.pp = stage, pp
        self.first, self.last = stage == 0, stage == pp - 1
        vis, txt = stage_blocks(cfg, pp)
        self.vision = _trim(model.vision, vis[stage], first=self.first,
                            last=self.last, embed=("patch_embed", "cls", "pos"), head=("norm", "proj"))
        self.text = _trim(model.text, txt[stage], first=self.first,
                          last=self.last, embed=("tok", "pos", "emb_norm"), head=("norm", "proj"))
        if self.last:
            self.fusion = model.fusion
            self.itc = model.itc

    def forward(self, inp: dict) -> dict:
        carry = self._embed(inp) if self.first else inp
        packed = "vcu" in carry
        lay = carry.get("layout")  # the host sizes stage 0's batch came with (None: none)
        if packed:
            # What the layout lacks is read from the tensors (a device sync each).
            lay = fill(grid_layout(lay, cu_seqlens=carry["vcu"]), lengths=carry["lengths"])
            vkey = segments(carry["vcu"][1:] - carry["vcu"][:-1], sizes=[n + 1 for n in lay.image_counts])
            tkey = segments(carry["lengths"].clamp(min=1), sizes=lay.text_counts)
        else:
            vkey = carry["vmask"]
            tkey = length_mask(carry["lengths"], carry["tx"].shape[1])
        vx, tx = carry["vx"], carry["tx"]
        for blk in self.vision.blocks.values():
            vx = blk(vx, vkey)
        for blk in self.text.blocks.values():
            tx = blk(tx, tkey)
        if not self.last:
            return {**carry, "vx": vx, "tx": tx}
        img = self.vision.head_packed(vx, carry["vcu"]) if packed else self.vision.head(vx, carry["vmask"])
        txt = self.text.head(tx, carry["lengths"])
        logits = self.fusion(img, txt, carry["neg_text"], carry["neg_image"], layout=lay)
        return {"img_emb": img.emb, "txt_emb": txt.emb, "itm_logits": logits, "logit_scale": self.itc()}

    def _embed(self, mb: Batch) -> dict:
        meta = {"lengths": mb.lengths, "weight": mb.weight, "neg_text": mb.neg_text, "neg_image": mb.neg_image,
                "layout": mb.layout}
        if mb.packed:
            vx, vcu = self.vision.embed_packed(mb.patches, mb.cu_seqlens_image, mb.image_grid, mb.layout)
            tx, _ = self.text.embed_packed(mb.input_ids, mb.lengths, mb.layout)
            return {"vx": vx, "vcu": vcu, "tx": tx, **meta}
        vx, vmask = self.vision.embed(mb.pixel_values, mb.pixel_shape, mb.layout)
        tx, _ = self.text.embed(mb.input_ids, mb.lengths)
        return {"vx": vx, "vmask": vmask, "tx": tx, **meta}


# -- the step ------------------------------------------------------------------------------

@dataclass(slots=True)
class StepPlan:
    """What every stage learns from stage 0 at the start of a step."""

    micro_batches: int
    global_weight: torch.Tensor
    sizes: list[list[int]]
    """Per micro-batch, the sample count of every dp rank (the contrastive gather)."""


def broadcast_plan(micro_batches: list[Batch] | None, *, dims: ParallelDims, device: torch.device) -> StepPlan | None:
    """Stage 0 (which holds ``micro_batches``; None there means the end of the data) tells
    the other stages of its dp replica the step's (M, W, per-rank sizes); None = stop.
    Every stage calls it once per step; it is a collective over the pp group. M and the
    sizes travel as host tensors on the pp host group (the schedule needs them on the host:
    no device sync), W stays on the device."""
    host, group = dims.host_group(PP), dims.pp_group()
    src = dims.stage_rank(0)
    head = torch.zeros(2, dtype=torch.int64)
    sizes = total_w = None
    if dims.first_stage:
        from ..step import _dp_sizes  # the same per-rank size table as without pp
        if micro_batches:
            local_w = torch.stack([mb.weight.sum() for mb in micro_batches]).sum()
            total_w = losses.global_weight(local_w, dims.dp_group())
            sizes = torch.tensor(_dp_sizes(micro_batches, dims, device), dtype=torch.int64).reshape(-1)
            head[0], head[1] = len(micro_batches), WIRE_DTYPES.index(total_w.dtype)
    if host is not None:
        dist.broadcast(head, src=src, group=host)
    m = int(head[0])
    if m == 0:
        return None
    if sizes is None:
        sizes = torch.empty(m * dims.dp, dtype=torch.int64)
        total_w = torch.empty((), dtype=WIRE_DTYPES[int(head[1])], device=device)
    if host is not None:
        dist.broadcast(sizes, src=src, group=host)
        dist.broadcast(total_w, src=src, group=group)
    return StepPlan(m, total_w, sizes.view(m, dims.dp).tolist())


@dataclass(slots=True)
class PipelineConfig:
    schedule: str = "1f1b"
    """1f1b or gpipe."""
    pack: bool = False
    """Packed micro-batches (what travels between stages differs)."""

    def validate(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"pipeline: --pp-schedule {self.schedule!r}, want one of {SCHEDULES}")


class Runner:
    """Runs one step's schedule on this stage; holds the links to the neighbour stages."""

    def __init__(self, module: nn.Module, *, dims: ParallelDims, cfg: PipelineConfig, device: torch.device):
        cfg.validate()
        self.module, self.dims, self.cfg, self.device = module, dims, cfg, device
        s = dims.pp_rank
        self.link = Link(prev=dims.stage_rank(s - 1) if s > 0 else None,
                         next=dims.stage_rank(s + 1) if s < dims.pp - 1 else None, device=device, packed=cfg.pack,
                         host=dims.host_group(PP))

    def run(self, plan: StepPlan, micro_batches: list[Batch] | None,
            autocast: contextlib.AbstractContextManager | None = None,
            clock: timing.StepClock | None = None) -> torch.Tensor | None:
        """Forward and backward of every micro-batch; returns the loss share (last stage).
        Forwards and waits for other ranks are marked on ``clock`` (None: not timed)."""
        dims, link = self.dims, self.link
        autocast = autocast or contextlib.nullcontext()
        saved: dict[int, tuple] = {}
        loss_sum = torch.zeros((), dtype=plan.global_weight.dtype, device=self.device)
        acts = schedule(self.cfg.schedule, dims.pp, dims.pp_rank, plan.micro_batches)
        for n, (kind, i) in enumerate(acts):
            last_backward = n == len(acts) - 1
            if kind == "F":
                inp = micro_batches[i] if dims.first_stage else link.recv_forward(i, clock)
                with autocast, timing.forward(clock):
                    out = self.module(inp)
                if dims.last_stage:
                    loss = self._loss(out, inp, plan, i, clock)
                    saved[i] = (inp, loss)
                    loss_sum += loss.detach()
                else:
                    # The sample weights bypass the stage: a mixed-precision stage casts its
                    # floating inputs to bf16, which would round them.
                    out["weight"] = inp.weight if dims.first_stage else inp["weight"]
                    # Posted at once when another forward follows (nothing to pair it with).
                    link.send_forward(i, out, post=n + 1 < len(acts) and acts[n + 1][0] == "F")
                    saved[i] = (inp, out)
            else:
                inp, out = saved.pop(i)
                self._sync_grads(last_backward)
                if dims.last_stage:
                    out.backward()
                else:
                    sent = [out[k] for k in GRAD_KEYS]
                    grads = link.recv_backward(sent, clock)
                    torch.autograd.backward(sent, grads)
                if not dims.first_stage:
                    link.send_backward([inp[k].grad for k in GRAD_KEYS])
        link.flush(clock)
        self._reduce_ddp(clock)
        return loss_sum if dims.last_stage else None

    def _loss(self, out: dict, carry: dict, plan: StepPlan, i: int, clock: timing.StepClock | None) -> torch.Tensor:
        dims = self.dims
        itc = losses.itc_sum(out["img_emb"], out["txt_emb"], carry["weight"], out["logit_scale"],
                             sizes=plan.sizes[i], rank=dims.dp_rank, group=dims.dp_group(), clock=clock)
        itm = losses.itm_sum(out["itm_logits"], carry["weight"], carry["neg_text"])
        return (itc + itm) / plan.global_weight

    def _sync_grads(self, enabled: bool) -> None:
        """FSDP2: reduce-scatter only in the step's last backward (accumulate before)."""
        if hasattr(self.module, "set_requires_gradient_sync"):
            self.module.set_requires_gradient_sync(enabled)

    def _reduce_ddp(self, clock: timing.StepClock | None) -> None:
        """DDP semantics without FSDP2: sum the gradients over dp in one flat all-reduce.
        After the schedule, not overlapped with backward: a choice (docs/trainer.md,
        "Pipeline parallelism"): only the stage's last backward, 1/M of its backward time,
        could hide it; the sharded path (FSDP2) overlaps its reduce-scatter there."""
        group = self.dims.dp_group()
        if group is None or self.dims.fsdp:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with timing.comm(clock):
            dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def parallelize_pipeline(model: MMModel, *, dims: ParallelDims, cfg, device: torch.device) -> nn.Module:
    """This rank's ``PipelineStage`` on ``device``, with the per-block wrappers of ``cfg``
    (a ``ParallelConfig``) and FSDP2 over dp when ``cfg.fsdp`` (else replicated: gradients
    are all-reduced by ``Runner``), with its mixed-precision and CPU-offload policies as
    without pp (``parallelize``): stage outputs, and so the activations sent on, are fp32."""
    cfg.validate(dims.dp)
    stage = PipelineStage(model, dims.pp_rank, dims.pp).to(device)
    blockwrap.apply_ac(stage, cfg.ac)
    if cfg.compile:
        blockwrap.apply_compile(stage, backend=cfg.compile_backend)
    if dims.dp > 1 and cfg.fsdp:
        _apply_fsdp(stage, dims, cfg)
    elif dims.dp > 1:
        _broadcast_params(stage, dims)
    return stage


def _apply_fsdp(stage: PipelineStage, dims: ParallelDims, cfg) -> None:
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from ..parallelize import _fsdp_policies, reshard_after_forward
    mesh = dims.dp_mesh()
    reshard = reshard_after_forward(cfg, dims.pp)  # ZeRO-2 by default: see ParallelConfig
    for block in blockwrap.blocks(stage):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, **_fsdp_policies(cfg, root=False))
    fully_shard(stage, mesh=mesh, reshard_after_forward=reshard, **_fsdp_policies(cfg, root=True))
    for module in stage.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def _broadcast_params(stage: nn.Module, dims: ParallelDims) -> None:
    """Start every dp replica of the stage from dp rank 0's parameters (as DDP does)."""
    src = dims.stage_rank(dims.pp_rank) - dims.dp_rank * dims.pp * dims.mp
    for p in stage.parameters():
        dist.broadcast(p.data, src=src, group=dims.dp_group())


@dataclass(slots=True)
class PipelineStepStats:
    loss: torch.Tensor | None
    global_weight: torch.Tensor | None
    grad_norm: torch.Tensor
    samples: int
    clock: timing.StepClock | None = None
    """The step's timeline; read it (``compute_seconds``) at a log step: on CUDA it syncs."""

    @property
    def compute_seconds(self) -> float:
        """This stage's forward + backward time, without its waits for other stages."""
        return self.clock.compute_seconds() if self.clock is not None else 0.0


def train_step(runner: Runner, optimizer: torch.optim.Optimizer, scheduler, micro_batches: list[Batch] | None, *,
               max_grad_norm: float, autocast: contextlib.AbstractContextManager | None = None
               ) -> PipelineStepStats | None:
    """One pipelined step on this stage: the plan from stage 0, the schedule, clip over the
    whole model (dp shards and pp stages), update. Returns None at the end of the data
    (stage 0 passed None or an empty list)."""
    dims, device = runner.dims, runner.device
    plan = broadcast_plan(micro_batches, dims=dims, device=device)
    if plan is None:
        return None
    clock = timing.StepClock(device)
    loss = runner.run(plan, micro_batches, autocast, clock)
    norm = clip_grad_norm(runner.module, max_grad_norm, sharded_group=dims.dp_group() if dims.fsdp else None,
                          model_group=dims.pp_group(), comm_device=device)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    # Every stage reports the step loss (the log line comes from global rank 0, a first stage).
    share = loss if loss is not None else torch.zeros((), dtype=plan.global_weight.dtype, device=device)
    dist.broadcast(share, src=dims.stage_rank(dims.pp - 1), group=dims.pp_group())
    live = sum(mb.num_live for mb in micro_batches) if micro_batches else 0
    return PipelineStepStats(loss=share, global_weight=plan.global_weight, grad_norm=norm, samples=live,
                             clock=clock)
