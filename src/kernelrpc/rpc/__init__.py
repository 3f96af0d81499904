"""Client side of kernelrpc: sessions with device servers and the tracker client."""
from __future__ import annotations

import importlib

_LAZY = {
    "connect": ".client",
    "RPCSession": ".client",
    "connect_tracker": ".tracker_client",
    "TrackerSession": ".tracker_client",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
