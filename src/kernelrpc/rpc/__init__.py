"""Client side of kernelrpc: sessions with device servers, the local session and the tracker
client. Names load on first use and are listed by ``dir()`` (so tab completion finds them)."""
from __future__ import annotations

import importlib

_LAZY = {
    "connect": ".client",
    "RPCSession": ".client",
    "LocalSession": "..server.local",  # the server's parts in this process; only named here
    "connect_tracker": ".tracker_client",
    "TrackerSession": ".tracker_client",
    "TrackerSummary": ".tracker_summary",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
