"""Idempotent llvmlite initialisation (llvmlite 0.50: ``llvm.initialize()`` raises)."""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def ensure_llvm():
    """Return ``llvmlite.binding`` with the native and all other targets registered."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm
