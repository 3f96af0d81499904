"""kernelrpc: compile CPU kernels on a host and measure them on remote devices.

Importing the package is cheap and needs only the standard library; the
compiler (numpy, llvmlite) loads on first use of ``build`` / ``lower`` / ``te``.
"""
from __future__ import annotations

import sys

from .errors import (AllocationFailed, AuthenticationError, ConnectionLost, ConnectTimeout, HandshakeError,
                     ProtocolError, QueueTimeout, RemoteError, RPCError, ServerCrashed, SessionTimeout, TrackerError,
                     VersionMismatch)

__version__ = "0.1.0"

_LAZY = {
    "cpu": ("kernelrpc.runtime", "cpu"),
    "device": ("kernelrpc.runtime", "device"),
    "build": ("kernelrpc.compiler", "build"),
    "lower": ("kernelrpc.compiler", "lower"),
    "Target": ("kernelrpc.compiler", "Target"),
    "te": ("kernelrpc.te", None),
    "tir": ("kernelrpc.tir", None),
    "target": ("kernelrpc.target", None),
    "testing": ("kernelrpc.testing", None),
    "contrib": ("kernelrpc.contrib", None),
    "nd": ("kernelrpc.nd", None),
    "display": ("kernelrpc.display", None),
    "rpc": ("kernelrpc.rpc", None),
    "runtime": ("kernelrpc.runtime", None),
    "measure": ("kernelrpc.measure", None),
    "autotvm": ("kernelrpc.autotvm", None),
}


def _load(module: str):
    """``importlib.import_module(module)`` for an absolute name, without loading ``importlib``
    (with ``warnings``, about half of what ``import kernelrpc`` costs otherwise)."""
    __import__(module)
    return sys.modules[module]


def __getattr__(name: str):
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _load(entry[0])
    return module if entry[1] is None else getattr(module, entry[1])


def __dir__() -> list[str]:
    """The lazily loaded names too, so ``dir()`` and tab completion show them."""
    return sorted({*globals(), *_LAZY})


__all__ = ["AllocationFailed", "AuthenticationError", "ConnectionLost", "ConnectTimeout", "HandshakeError", "ProtocolError", "QueueTimeout",
           "RemoteError", "RPCError", "ServerCrashed", "SessionTimeout", "TrackerError",
           "VersionMismatch", "__version__", *sorted(_LAZY)]
