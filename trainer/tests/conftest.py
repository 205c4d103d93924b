"""Test setup: import mmfeed_trainer from the source tree (also in spawned/torchrun children)."""

import os
import sys

TRAINER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for path in (TESTS_DIR, TRAINER_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TRAINER_DIR, TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)
