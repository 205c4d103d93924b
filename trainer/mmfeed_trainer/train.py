"""Compatibility path: ``mmfeed_trainer.train`` is ``mmfeed_trainer.loop.train`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .loop import train as _module

sys.modules[__name__] = _module
