"""Batch measurement: many candidate schedules built on the host, measured across a fleet.

``kernelrpc.measure(candidates, key=..., tracker=..., inputs=...)`` (see docs/measure.md). The
package is itself callable, so ``kernelrpc.measure(...)`` and ``from kernelrpc.measure import
MeasureResult`` both work.
"""
from __future__ import annotations

import sys
import types

from .batch import MeasureBatch, default_executor, measure
from .cache import BuildCache
from .result import (COMPILE_ERROR, OK, RUNTIME_ERROR, STATUSES, TIMEOUT, WRONG_RESULT,
                     MeasureResult, format_seconds)

__all__ = ["BuildCache", "COMPILE_ERROR", "OK", "RUNTIME_ERROR", "STATUSES", "TIMEOUT", "WRONG_RESULT",
           "MeasureBatch", "MeasureResult", "default_executor", "format_seconds", "measure"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs) -> MeasureBatch:
        return measure(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
