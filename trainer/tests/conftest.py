"""Test setup: import mmfeed_trainer from the source tree (also in spawned/torchrun children)."""

import logging
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


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """Each test leaves no stream handler on the root logger, and its level as it was: a test that runs
    ``python -m mmfeed_trainer``'s ``main`` in-process installs a handler on the stderr pytest
    captures for it, and a later test's log line would hit that closed file (a "Logging
    error" traceback on stderr, which the quiet-logging tests check for)."""
    before, level = list(logging.root.handlers), logging.root.level
    yield
    for h in list(logging.root.handlers):
        if h not in before and type(h) is logging.StreamHandler:  # not pytest's capture handlers
            logging.root.removeHandler(h)
    logging.root.setLevel(level)
