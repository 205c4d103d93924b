"""Compatibility path: ``mmfeed_trainer.batches`` is ``mmfeed_trainer.data.batches`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import batches as _module

sys.modules[__name__] = _module
