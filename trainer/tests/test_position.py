"""Position: the typed resume position keeps the plain-dict forms checkpoints and states use."""

import pickle

import pytest

from mmfeed_trainer.data.position import STATE_VERSION, Position


@pytest.mark.parametrize("stored, want", [
    ({"epoch": 1, "next_step": 7}, {"epoch": 1, "next_step": 7}),  # shard / synthetic source
    ({"epoch": 0, "next_step": 3, "plan_hash": "plan0"}, {"epoch": 0, "next_step": 3, "plan_hash": "plan0"}),
    ({"epoch": 2, "next_step": 0, "plan_hash": ""}, {"epoch": 2, "next_step": 0, "plan_hash": ""}),
    ({}, {"epoch": 0, "next_step": 0}),
    (None, {"epoch": 0, "next_step": 0}),
])
def test_checkpoint_form_round_trips_unchanged(stored, want):
    assert Position.from_dict(stored).to_dict() == want


def test_state_form_is_the_dataset_state_dict_and_pickles():
    state = {"version": STATE_VERSION, "epoch": 1, "next_step": 4, "next_micro_batch": 2, "plan_hash": "abc"}
    pos = Position.from_state(state)
    assert pos == Position(1, 4, 2, "abc")
    assert pos.state() == state
    assert pickle.loads(pickle.dumps(pos.state())) == state
    assert Position().state() == {"version": STATE_VERSION, "epoch": 0, "next_step": 0, "next_micro_batch": 0,
                                  "plan_hash": ""}


@pytest.mark.parametrize("state, err", [
    ({"version": 99, "epoch": 0, "next_step": 0, "next_micro_batch": 0}, "state version 99"),
    ({"version": STATE_VERSION, "epoch": -1, "next_step": 0, "next_micro_batch": 0}, "must be ints >= 0"),
    ({"version": STATE_VERSION, "epoch": 0, "next_step": "3", "next_micro_batch": 0}, "must be ints >= 0"),
])
def test_bad_state_is_a_clear_error(state, err):
    with pytest.raises(ValueError, match=err):
        Position.from_state(state)


def test_handed_out_advances_to_the_next_micro_batch_then_step():
    pos = Position()
    pos.handed_out({"epoch": 0, "step": 5, "micro_batch": 0}, 2)
    assert (pos.epoch, pos.next_step, pos.next_micro_batch) == (0, 5, 1)
    assert pos.skips({"epoch": 0, "step": 5, "micro_batch": 0})
    assert not pos.skips({"epoch": 0, "step": 5, "micro_batch": 1})
    pos.handed_out({"epoch": 0, "step": 5, "micro_batch": 1}, 2)
    assert (pos.epoch, pos.next_step, pos.next_micro_batch) == (0, 6, 0)
