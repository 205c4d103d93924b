"""Compatibility path: ``mmfeed_trainer.model`` is ``mmfeed_trainer.models.model`` (the same module
object, so attributes set on either are seen by both)."""

import sys

from .models import model as _module

sys.modules[__name__] = _module
