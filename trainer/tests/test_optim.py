"""optim: clipping and AdamW run a constant number of ops per step, not a few per parameter
(the base model has 525 parameter tensors; ~1.5k small kernels a step were launched for the
norm alone), and the clipped gradients are those of the textbook formula."""

from __future__ import annotations

import collections
import types

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mmfeed_trainer.parallel import optim
from mmfeed_trainer.models.config import OptimConfig

PARAMS = 600
"""Parameter tensors of the test module: more than the base model's 525."""


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched inside it (each one at least a kernel launch on CUDA)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def module_with_grads(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    m = nn.ModuleList(nn.Linear(4, 3) for _ in range(PARAMS // 2)).to(dtype)
    for p in m.parameters():
        p.grad = torch.randn_like(p)
    return m


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_clip_grad_norm_is_a_constant_number_of_ops(dtype, tol):
    m = module_with_grads(dtype)
    grads = [p.grad.clone() for p in m.parameters()]
    want = torch.sqrt(sum((g.to(torch.float64) ** 2).sum() for g in grads))
    with CountOps() as count:
        norm = optim.clip_grad_norm(m, 1.0)
    total = sum(count.ops.values())
    assert total <= 16, (total, count.ops.most_common(5))
    assert norm.dtype == dtype and abs(float(norm) - float(want)) <= tol * float(want), (float(norm), float(want))
    coef = 1.0 / (float(norm) + 1e-6)
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(p.grad, g * coef, rtol=tol * 10, atol=0)


def test_clip_grad_norm_leaves_small_gradients_alone():
    m = module_with_grads(torch.float32)
    grads = [p.grad.clone() for p in m.parameters()]
    norm = optim.clip_grad_norm(m, 1e6)
    assert float(norm) > 0
    for g, p in zip(grads, m.parameters()):
        assert torch.equal(p.grad, g)


@pytest.mark.parametrize("devices,want", [
    (["cuda", "cuda"], {"fused": True}),
    (["cpu", "cpu"], {"foreach": True}),
    (["cuda", "cpu"], {"foreach": True}),  # FSDP2 CPU offload keeps some state on the host
    ([], {"foreach": True}),
])
def test_adamw_is_fused_when_every_parameter_is_on_cuda(devices, want):
    params = [types.SimpleNamespace(is_cuda=d == "cuda") for d in devices]
    assert optim.implementation(params) == want


def test_build_optimizer_on_cpu_is_foreach():
    opt, _ = optim.build_optimizer(nn.Linear(3, 2), OptimConfig(lr=1e-3, warmup_steps=1, total_steps=2))
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"], opt.defaults


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_build_optimizer_on_cuda_is_fused():
    opt, _ = optim.build_optimizer(nn.Linear(3, 2).cuda(), OptimConfig(lr=1e-3, warmup_steps=1, total_steps=2))
    assert opt.defaults["fused"] is True, opt.defaults
