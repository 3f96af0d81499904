"""The native relay loop's ABI, and its build: ``native_relay.c`` compiled by the host's C compiler.

The loop is C (``native_relay.c``; what it does is told there), compiled and linked by the
toolchain that builds the module runtime (``deploy/toolchain.py``, cached on disk per source and
compiler), so the layouts it shares with the kernel (``struct pollfd``, ``struct timespec``)
and the constants come from the C library's own headers, not from declarations here.

The function's parameters are :data:`PARAMS`, the one place in Python the ABI is declared:
the ``ctypes`` prototype is generated from it, and a test checks it against the C signature.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..deploy.toolchain import Toolchain, compiled_object

NAME = "kernelrpc_relay"
SOURCE = Path(__file__).with_name("native_relay.c")
STOPPED = 1  # return value: stopped through stop_flag / stop_fd (STOPPED in the C source)


@dataclass(frozen=True)
class Param:
    name: str
    c_type: type
    meaning: str


PARAMS = (
    Param("a", ctypes.c_int32, "socket a"),
    Param("b", ctypes.c_int32, "socket b"),
    Param("buf_ab", ctypes.c_void_p, "buffer from a to b (cap bytes)"),
    Param("buf_ba", ctypes.c_void_p, "buffer from b to a (cap bytes)"),
    Param("cap", ctypes.c_int64, "size of each buffer"),
    Param("pend_ab", ctypes.c_int64, "bytes already in buf_ab for b (the pairing reply)"),
    Param("pend_ba", ctypes.c_int64, "bytes already in buf_ba for a"),
    Param("stop_fd", ctypes.c_int32, "readable when the loop must stop (ends a poll)"),
    Param("stop_flag", ctypes.c_void_p, "int32, non-zero when the loop must stop"),
    Param("spin_ns", ctypes.c_int64, "keep polling this long after a short message"),
    Param("moved", ctypes.c_void_p, "int64[2]: bytes read from a, from b (written at exit)"),
)
RESULT = ctypes.c_int64  # 0: a side ended; STOPPED; -errno: a socket failed
PROTOTYPE = ctypes.CFUNCTYPE(RESULT, *(p.c_type for p in PARAMS))


def arguments(**values) -> list:
    """The values in :data:`PARAMS` order; every parameter exactly once, by name."""
    names = [p.name for p in PARAMS]
    if set(values) != set(names):
        raise TypeError(f"{NAME} takes {names}, got {sorted(values)}")
    return [values[name] for name in names]


@dataclass(frozen=True)
class RelayLoop:
    """The loaded loop, called with :data:`PARAMS` by name; returns :data:`RESULT`."""

    function: ctypes._CFuncPtr
    library: ctypes.CDLL     # keeps the code mapped while the function is in use

    def __call__(self, **values) -> int:
        return self.function(*arguments(**values))


def compile_relay(toolchain: Toolchain, source: Path = SOURCE) -> RelayLoop:
    """``source`` compiled and linked by ``toolchain`` (both cached), and loaded; a compiler's
    or linker's error is a ToolchainError naming it."""
    obj = compiled_object(toolchain, source)
    library = obj.with_suffix(".so")
    if not library.exists() or library.stat().st_mtime < obj.stat().st_mtime:
        fd, tmp = tempfile.mkstemp(dir=obj.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            toolchain.link_shared(tmp, [obj])
            os.replace(tmp, library)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    loaded = ctypes.CDLL(str(library))
    return RelayLoop(PROTOTYPE((NAME, loaded)), loaded)
