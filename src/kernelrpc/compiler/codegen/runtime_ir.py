"""The module runtime's parts that are LLVM IR, and where its C source lives.

Every exported module carries its own runtime (docs/module-format.md). The timer,
cache flush and thread pool are C (``module_runtime.c``), compiled for each target
by the toolchain that links the module, so struct layouts (``timespec``,
``pthread_mutex_t``, ``cpu_set_t``) and constants come from the target's C library
headers rather than from the host's. What is emitted here as IR is the part that
depends on nothing but the bytes: the metadata document and its accessor.

The metadata also lives in its own ELF section (:data:`METADATA_SECTION`), so a
loader can read the module's target record from the file before ``dlopen``.
"""
from __future__ import annotations

from pathlib import Path

#: Workers beyond the calling thread (the caller always runs task 0); KRPC_MAX_WORKERS in C.
MAX_WORKERS = 63
LAUNCH_SYMBOL = "__kernelrpc_parallel_launch"
WORKSPACE_ALLOC = "__kernelrpc_workspace_alloc"
WORKSPACE_FREE = "__kernelrpc_workspace_free"
METADATA_SECTION = "kernelrpc_metadata"
RUNTIME_SOURCE = Path(__file__).with_name("module_runtime.c")


def _string_constant(name: str, text: str, section: str) -> str:
    data = text.encode("utf-8") + b"\0"
    body = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in data)
    return (f'@{name} = internal constant [{len(data)} x i8] c"{body}", '
            f'section "{section}", align 1')


def metadata_ir(metadata_json: str) -> str:
    """LLVM IR text of ``__kernelrpc_metadata`` returning the given document."""
    return f"""
{_string_constant("__krpc_meta", metadata_json, METADATA_SECTION)}
@llvm.used = appending global [1 x ptr] [ptr @__krpc_meta], section "llvm.metadata"

define ptr @__kernelrpc_metadata() nounwind {{
  ret ptr @__krpc_meta
}}
"""
