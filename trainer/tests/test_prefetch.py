"""Prefetcher: host-only mode (the stream client's), the epoch limit, errors from its thread."""

import pytest

from mmfeed_trainer.data import synthetic
from mmfeed_trainer.parallel.parallel_dims import ROLE_FULL
from mmfeed_trainer.data.prefetch import Prefetcher
from mmfeed_trainer.data.sources import Source, StepData


class ThreeEpochs(Source):
    """Two steps per epoch, epochs 0..2, from the position on; ``fail_at`` raises there."""

    def __init__(self, fail_at=None):
        super().__init__()
        self.fail_at = fail_at

    def steps(self, position):
        for epoch in range(position.get("epoch", 0), 3):
            for step in range(position.get("next_step", 0) if epoch == position.get("epoch", 0) else 0, 2):
                if (epoch, step) == self.fail_at:
                    raise ValueError("bad record")
                yield StepData(step, synthetic.step_records(synthetic.SynthConfig(), step, 0), epoch=epoch)


def drain(prefetcher):
    got = []
    try:
        while True:
            host, _ = prefetcher.next()
            got.append(host)
    except StopIteration:
        return got
    finally:
        prefetcher.close()


@pytest.mark.parametrize("position, epochs, want", [
    ({"epoch": 0, "next_step": 0}, None, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]),
    ({"epoch": 1, "next_step": 1}, 1, [(1, 1)]),
    ({"epoch": 0, "next_step": 1}, 2, [(0, 1), (1, 0), (1, 1)]),
])
def test_host_only_steps_up_to_the_epoch_limit(position, epochs, want):
    got = drain(Prefetcher(ThreeEpochs(), position=position, role=ROLE_FULL, pad_id=0, device=None,
                           check_pack=False, epochs=epochs))
    assert [(h.data.epoch, h.data.step) for h in got] == want
    for h in got:
        assert h.micro_batches is h.host_batches  # no device copy
        assert len(h.micro_batches) == len(h.data.records)
        assert not h.micro_batches[0].weight.is_pinned()


def test_an_error_in_the_thread_is_raised_in_the_caller():
    p = Prefetcher(ThreeEpochs(fail_at=(0, 1)), position={"epoch": 0, "next_step": 0}, role=ROLE_FULL, pad_id=0,
                   device=None, check_pack=False)
    try:
        p.next()
        with pytest.raises(ValueError, match="bad record"):
            p.next()
    finally:
        p.close()


def test_a_stuck_thread_is_an_error_within_the_sources_bound():
    """Before: ``next()`` waited for the thread without a bound, so a source stuck in a wait it
    does not bound itself hung the training thread."""
    import threading
    import time
    from mmfeed_trainer.data.prefetch import PrefetchTimeout

    release = threading.Event()

    class Stuck(Source):
        def wait_bound_s(self):
            return 0.5

        def steps(self, position):
            release.wait(30)
            yield from ()

    p = Prefetcher(Stuck(), position={}, role=ROLE_FULL, pad_id=0, device=None, check_pack=False, name="stuck")
    t0 = time.monotonic()
    try:
        with pytest.raises(PrefetchTimeout, match="thread stuck produced no step for 0.5 s"):
            p.next()
        assert time.monotonic() - t0 < 5
    finally:
        release.set()
        p.close()
