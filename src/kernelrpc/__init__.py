"""kernelrpc: compile CPU kernels on a host and measure them on remote devices.

Importing the package is cheap and needs only the standard library; the
compiler (numpy, llvmlite) loads on first use of ``build`` / ``lower`` / ``te``.
"""
from __future__ import annotations

import importlib

from .errors import (AuthenticationError, ConnectionLost, ConnectTimeout, HandshakeError, ProtocolError, QueueTimeout,
                     RemoteError, RPCError, ServerCrashed, SessionTimeout, TrackerError,
                     VersionMismatch)

__version__ = "0.1.0"

_LAZY = {
    "cpu": (".runtime", "cpu"),
    "device": (".runtime", "device"),
    "build": (".compiler", "build"),
    "lower": (".compiler", "lower"),
    "Target": (".compiler", "Target"),
    "te": (".te", None),
    "tir": (".tir", None),
    "target": (".target", None),
    "testing": (".testing", None),
    "contrib": (".contrib", None),
    "nd": (".nd", None),
    "display": (".display", None),
    "rpc": (".rpc", None),
    "runtime": (".runtime", None),
    "measure": (".measure", None),
    "autotvm": (".autotvm", None),
}


def __getattr__(name: str):
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(entry[0], __name__)
    return module if entry[1] is None else getattr(module, entry[1])


def __dir__() -> list[str]:
    """The lazily loaded names too, so ``dir()`` and tab completion show them."""
    return sorted({*globals(), *_LAZY})


__all__ = ["AuthenticationError", "ConnectionLost", "ConnectTimeout", "HandshakeError", "ProtocolError", "QueueTimeout",
           "RemoteError", "RPCError", "ServerCrashed", "SessionTimeout", "TrackerError",
           "VersionMismatch", "__version__", *sorted(_LAZY)]
