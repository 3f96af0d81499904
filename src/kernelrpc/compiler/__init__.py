"""The compiler: tensor expressions, schedules, lowering, llvmlite code generation, build, export.

Users reach it through :mod:`kernelrpc.te` (TVM's names) and ``kernelrpc.build`` / ``lower``.
"""
from __future__ import annotations

from .build import BuiltModule, build
from .lower import LowerError, PassContext, lower
from .target import Target

__all__ = ["BuiltModule", "LowerError", "PassContext", "Target", "build", "lower"]
