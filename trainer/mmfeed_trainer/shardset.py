"""Compatibility path: ``mmfeed_trainer.shardset`` is ``mmfeed_trainer.data.shardset`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import shardset as _module

sys.modules[__name__] = _module
