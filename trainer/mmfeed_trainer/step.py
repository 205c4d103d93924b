"""Compatibility path: ``mmfeed_trainer.step`` is ``mmfeed_trainer.parallel.step`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .parallel import step as _module

sys.modules[__name__] = _module
