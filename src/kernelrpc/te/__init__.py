"""Tensor expressions, schedules and lowering (the compiler frontend)."""
from __future__ import annotations

from . import expr, ir
