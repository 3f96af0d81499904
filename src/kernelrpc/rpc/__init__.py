"""Client side of kernelrpc: sessions with device servers (:mod:`.client`, over :mod:`.channel`,
with :mod:`.remote`'s handles), the tracker client (:mod:`.tracker_client`, :mod:`.tracker_summary`)
and TVM's ``LocalSession``. The byte formats they speak are in :mod:`kernelrpc.wire`. Names load on
first use and are listed by ``dir()`` (so tab completion finds them)."""
from __future__ import annotations

from .. import _load

_LAZY = {
    "connect": "kernelrpc.rpc.client",
    "RPCSession": "kernelrpc.rpc.client",
    "connect_tracker": "kernelrpc.rpc.tracker_client",
    "TrackerSession": "kernelrpc.rpc.tracker_client",
    "TrackerSummary": "kernelrpc.rpc.tracker_summary",
}

__all__ = sorted({*_LAZY, "LocalSession"})


def __getattr__(name: str):
    if name == "LocalSession":
        # TVM's rpc.LocalSession is the server's parts in this process: the one arrow from the
        # client into a service (server/local.py), never the other way (tests/test_import_rules.py).
        from ..server.local import LocalSession

        return LocalSession
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_load(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
