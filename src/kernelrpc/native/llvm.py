"""llvmlite's initialisation and the host CPU's identity."""
from __future__ import annotations

import functools
from dataclasses import dataclass


@functools.lru_cache(maxsize=1)
def ensure_llvm():
    """Return ``llvmlite.binding`` with the native and all other targets registered.

    Idempotent (llvmlite 0.50's ``llvm.initialize()`` raises instead).
    """
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


@dataclass(frozen=True)
class HostCPU:
    """The CPU this process runs on, as LLVM names it."""

    triple: str     # e.g. x86_64-unknown-linux-gnu
    cpu: str        # e.g. znver4
    features: str   # "+feat,..." of every feature the CPU has

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]


@functools.lru_cache(maxsize=1)
def host_cpu() -> HostCPU:
    llvm = ensure_llvm()
    features = llvm.get_host_cpu_features()
    enabled = ",".join(f"+{name}" for name, on in sorted(features.items()) if on)
    return HostCPU(llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled)
