"""The tracker's state as tables: text in a terminal, HTML in Jupyter.

``TrackerSession.summary()`` stays TVM's dict; ``summary_table()`` wraps it in a
:class:`TrackerSummary`. The extra keys of kernelrpc's tracker (``leases``, ``waiting``,
``stats``) add who holds each board and who waits; a TVM tracker's summary shows servers and
queues only. :func:`queue_state` reads one request's place in its queue from the same dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..display import Table, format_time


def _server_key(item: dict) -> str:
    parts = str(item.get("key", "")).split(":")
    return parts[1] if len(parts) > 1 else str(item.get("key", ""))


def _address(addr) -> str:
    return ":".join(map(str, addr)) if isinstance(addr, (list, tuple)) else str(addr)


class TrackerSummary:
    """A SUMMARY payload (``info``) shown as tables of queues, servers and waiting requests."""

    def __init__(self, info: dict, where: str = "") -> None:
        self.info = info
        self.where = where

    def _holders(self) -> dict[str, list[dict]]:
        held: dict[str, list[dict]] = {}
        for lease in self.info.get("leases", []):
            held.setdefault(_address(lease.get("server", "")), []).append(lease)
        return held

    def tables(self) -> list[Table]:
        info = self.info
        stats = info.get("stats", {})
        servers = info.get("server_info", [])
        counts: dict[str, int] = {}
        for item in servers:
            counts[_server_key(item)] = counts.get(_server_key(item), 0) + 1
        queue_rows = []
        for key, queue in sorted(info.get("queue_info", {}).items()):
            if not (counts.get(key) or queue.get("pending")):
                continue
            s = stats.get(key, {})
            queue_rows.append([key, counts.get(key, 0), queue.get("free", 0),
                               queue.get("pending", 0), s.get("matches", "-"),
                               format_time(s["queue_wait_mean"]) if "queue_wait_mean" in s
                               else "-"])
        held = self._holders()
        knows_leases = "leases" in info  # a TVM tracker does not say who holds a server
        server_rows = []
        for item in sorted(servers, key=lambda x: (_server_key(x), _address(x.get("addr", "")))):
            address = _address(item.get("addr", ""))
            holder = ", ".join(f"{x.get('client', '?')} ({x.get('state', '?')}, "
                               f"{format_time(x.get('age', 0))})" for x in held.get(address, []))
            server_rows.append([address, _server_key(item),
                                holder or ("free" if knows_leases else "-")])
        title = f"Tracker {self.where}" if self.where else "Tracker"
        tables = [Table(["key", "servers", "free", "pending", "matches", "mean wait"],
                        queue_rows, title=f"{title}: queues"),
                  Table(["address", "key", "held by"], server_rows, title="servers")]
        waiting = info.get("waiting", [])
        if waiting:
            tables.append(Table(["key", "client", "priority", "waited"],
                                [[w.get("key"), w.get("client"), w.get("priority"),
                                  format_time(w.get("waited", 0))] for w in waiting],
                                title="waiting requests (in service order)"))
        return tables

    def __str__(self) -> str:
        return "\n\n".join(str(t) for t in self.tables())

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return "".join(t._repr_html_() for t in self.tables())


@dataclass
class QueueState:
    """Where one waiting request stands: its ``position`` in the key's queue (1 = next; None
    when the tracker does not list waiting requests), how many wait, and who holds the boards."""
    key: str
    position: int | None
    waiting: int
    servers: int
    free: int
    holders: list[dict] = field(default_factory=list)

    def __str__(self) -> str:
        where = (f"position {self.position} of {self.waiting}" if self.position
                 else f"{self.waiting} waiting")
        boards = f"{self.servers} board{'s' * (self.servers != 1)}, {self.free} free"
        if self.holders:
            boards += "; held by " + ", ".join(
                f"{h.get('client', '?')} ({format_time(h.get('age', 0))})" for h in self.holders)
        return f"{where}; {boards}"


def queue_state(info: dict, key: str, client: str) -> QueueState:
    """The state of ``client``'s (``host:port`` as the tracker sees it) request for ``key``."""
    waiting = [w for w in info.get("waiting", []) if w.get("key") == key]
    position = next((i + 1 for i, w in enumerate(waiting) if w.get("client") == client), None)
    queue = info.get("queue_info", {}).get(key, {})
    servers = sum(1 for item in info.get("server_info", []) if _server_key(item) == key)
    holders = [x for x in info.get("leases", []) if x.get("key") == key]
    return QueueState(key, position, len(waiting) or queue.get("pending", 0), servers,
                      queue.get("free", 0), holders)
