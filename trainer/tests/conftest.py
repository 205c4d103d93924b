"""Test setup: import mmfeed_trainer from the source tree (also in spawned/torchrun children)."""

import os
import sys

import pytest

TRAINER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for path in (TESTS_DIR, TRAINER_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TRAINER_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)


MMFEED_BIN = os.path.join(os.path.dirname(TRAINER_DIR), "bin", "mmfeed")


@pytest.fixture
def mmfeed():
    """The project's ``bin/mmfeed``; skipped without it, unless MMFEED_REQUIRE_PEERS says fail."""
    if not os.access(MMFEED_BIN, os.X_OK):
        if os.environ.get("MMFEED_REQUIRE_PEERS"):
            pytest.fail(f"{MMFEED_BIN} missing (make build)")
        pytest.skip(f"{MMFEED_BIN} missing (make build)")
    return MMFEED_BIN
