"""Compatibility path: ``mmfeed_trainer.parallelize`` is ``mmfeed_trainer.parallel.parallelize`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .parallel import parallelize as _module

sys.modules[__name__] = _module
