"""Client side of kernelrpc: sessions with device servers, the local session and the tracker
client. Names load on first use and are listed by ``dir()`` (so tab completion finds them)."""
from __future__ import annotations

from .. import _load

_LAZY = {
    "connect": "kernelrpc.rpc.client",
    "RPCSession": "kernelrpc.rpc.client",
    "LocalSession": "kernelrpc.server.local",  # the server's parts in this process; only named here
    "connect_tracker": "kernelrpc.rpc.tracker_client",
    "TrackerSession": "kernelrpc.rpc.tracker_client",
    "TrackerSummary": "kernelrpc.rpc.tracker_summary",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_load(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
