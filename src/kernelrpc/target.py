"""TVM's ``tvm.target``: ``kernelrpc.target.Target("llvm -mcpu=...", host="llvm")``."""
from __future__ import annotations

from .compiler.target import Target, TargetError, TargetKind, TargetOptionIgnored

__all__ = ["Target", "TargetError", "TargetKind", "TargetOptionIgnored"]
