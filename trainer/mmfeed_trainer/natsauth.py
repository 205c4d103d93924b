"""Compatibility path: ``mmfeed_trainer.natsauth`` is ``mmfeed_trainer.data.natsauth`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .data import natsauth as _module

sys.modules[__name__] = _module
