"""Compatibility path: ``mmfeed_trainer.wire`` is ``mmfeed_trainer.data.wire`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import wire as _module

sys.modules[__name__] = _module
