"""StepClock: waits for other ranks and the post-backward gradient sync are not compute."""

import time

import torch

from mmfeed_trainer import config, optim, synthetic, batches, timing
from mmfeed_trainer.model import MMModel
from mmfeed_trainer.parallel_dims import ParallelDims
from mmfeed_trainer.parallelize import ParallelConfig, parallelize
from mmfeed_trainer.step import train_step

CPU = torch.device("cpu")


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_comm_spans_and_time_after_backward_are_excluded():
    with timing.step_clock(CPU) as clock:
        busy(0.02)
        with timing.comm():
            time.sleep(0.5)  # waiting for a straggler
        busy(0.02)
        clock.mark_backward_done()
        time.sleep(0.5)  # gradient reduction wait
    got = clock.compute_seconds()
    assert 0.035 < got < 0.4, f"compute {got:.3f} s, want about 0.04 s"


def test_comm_without_an_active_clock_is_a_no_op():
    with timing.comm():
        pass
    assert timing.active() is None


def test_train_step_reports_compute_within_wall_time():
    torch.manual_seed(0)
    dims = ParallelDims()
    module = parallelize(MMModel(config.tiny()), dims=dims, cfg=ParallelConfig())
    opt, sched = optim.build_optimizer(module, config.OptimConfig())
    mbs = [batches.to_device(batches.record_to_batch(r), CPU)
           for r in synthetic.step_records(synthetic.SynthConfig(), 0, 0)]
    start = time.perf_counter()
    stats = train_step(module, opt, sched, mbs, dims=dims, device=CPU, max_grad_norm=1.0)
    wall = time.perf_counter() - start
    assert 0 < stats.compute_seconds <= wall
