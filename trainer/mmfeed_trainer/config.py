"""Compatibility path: ``mmfeed_trainer.config`` is ``mmfeed_trainer.models.config`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .models import config as _module

sys.modules[__name__] = _module
