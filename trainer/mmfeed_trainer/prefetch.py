"""Compatibility path: ``mmfeed_trainer.prefetch`` is ``mmfeed_trainer.data.prefetch`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import prefetch as _module

sys.modules[__name__] = _module
