"""ParallelDims validation and role mapping (no process group needed)."""

import pytest

from mmfeed_trainer.parallel.parallel_dims import ParallelDims, ROLE_FULL


@pytest.mark.parametrize("dp,mp,world,message", [
    (2, 2, 3, r"dp \(2\) \* mp \(2\) = 4 != world size 3"),
    (0, 1, 1, "dp must be >= 1"),
    (1, 3, 3, "mp must be 1 or 2"),
])
def test_invalid_layouts_name_the_problem(dp, mp, world, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(dp=dp, mp=mp, world_size=world)


def test_single_process_layout():
    dims = ParallelDims()
    assert dims.coords() == (0, 0)
    assert dims.role == ROLE_FULL and dims.has_loss
    assert dims.dp_group() is None and dims.mp_group() is None


@pytest.mark.parametrize("dp,pp,mp,world,message", [
    (2, 2, 1, 3, r"dp \(2\) \* pp \(2\) \* mp \(1\) = 4 != world size 3"),
    (1, 2, 2, 4, "pipeline stages .* need mp = 1"),
    (1, 0, 1, 1, "pp must be >= 1"),
])
def test_invalid_pipeline_layouts_name_the_problem(dp, pp, mp, world, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(dp=dp, pp=pp, mp=mp, world_size=world)


def test_single_process_is_both_pipeline_ends():
    dims = ParallelDims()
    assert dims.pp_rank == 0 and dims.first_stage and dims.last_stage and dims.pp_group() is None
