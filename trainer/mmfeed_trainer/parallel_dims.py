"""Compatibility path: ``mmfeed_trainer.parallel_dims`` is ``mmfeed_trainer.parallel.parallel_dims`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .parallel import parallel_dims as _module

sys.modules[__name__] = _module
