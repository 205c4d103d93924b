"""Compatibility path: ``mmfeed_trainer.stream`` is ``mmfeed_trainer.data.stream`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import stream as _module

sys.modules[__name__] = _module
