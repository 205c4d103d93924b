"""Compatibility path: ``mmfeed_trainer.sources`` is ``mmfeed_trainer.data.sources`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import sources as _module

sys.modules[__name__] = _module
