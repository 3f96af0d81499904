"""Who waits for whom at the proxy: a pure data structure, no sockets, no clock.

Devices connect with ``server:KEY``; each waiting device gets its own match key
``KEY:0.<random>`` (the form TVM's proxy uses with a tracker) and devices with the
same KEY queue side by side, oldest first.  TVM's proxy instead answers DUPLICATE
to a second device with the same key; queueing makes every device usable.

A client's match key (``client:M``) is looked up in this order:

1. ``M`` is the match key of one waiting device (a key handed out by the tracker):
   that device.
2. ``M`` is the KEY of waiting devices: the oldest one not promised to a tracker
   client, else the oldest one.
3. ``M`` was the match key of a device that has since gone or been renamed: the
   client is told MISMATCH at once, so a TVM tracker client retries right away.
4. Otherwise the client waits (FIFO per key) for a device to arrive.

Whether a device is offered at a tracker is not kept here: the tracker link's
registration machine owns that (``promised`` asks it).
"""
from __future__ import annotations

import collections
import dataclasses
import secrets
from collections.abc import Callable

DEFAULT_MAX_WAITING_PER_KEY = 256
RETIRED_MEMORY = 4096
"""How many gone match keys are remembered to answer MISMATCH at once."""


@dataclasses.dataclass(eq=False)
class Waiter:
    """One connection waiting at the proxy. ``handle`` is whatever the IO layer needs."""

    handle: object
    key: str
    """The peer's full handshake key, sent verbatim to its partner on pairing."""
    wanted: str
    """Devices: the KEY they serve.  Clients: the match key they asked for."""
    is_device: bool
    matchkey: str = ""
    """Devices only: the unique key under which the device is offered."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    action: str  # "pair", "wait", "mismatch", "duplicate"
    partner: Waiter | None = None


def new_matchkey(rpc_key: str, taken) -> str:
    """``KEY:0.<16 random digits>``: shaped like TVM's ``random_key`` but unpredictable."""
    while True:
        key = f"{rpc_key}:0.{secrets.randbelow(10 ** 16):016d}"
        if key not in taken:
            return key


class Matchmaker:
    def __init__(self, max_waiting_per_key: int = DEFAULT_MAX_WAITING_PER_KEY,
                 promised: Callable[[Waiter], bool] = lambda device: False) -> None:
        """``promised(device)``: the tracker handed the device's key to a client on its way."""
        self.max_waiting_per_key = max_waiting_per_key
        self.promised = promised
        self._devices: dict[str, dict[Waiter, None]] = {}  # KEY -> ordered set
        self._by_matchkey: dict[str, Waiter] = {}
        self._clients: dict[str, dict[Waiter, None]] = {}
        self._retired: collections.OrderedDict[str, None] = collections.OrderedDict()

    # -- arrivals ---------------------------------------------------------
    def add_device(self, handle, key: str, rpc_key: str) -> tuple[Waiter, Outcome]:
        waiter = Waiter(handle, key, rpc_key, True)
        clients = self._clients.get(rpc_key)
        if clients:
            partner = next(iter(clients))
            self._discard(self._clients, partner)
            return waiter, Outcome("pair", partner)
        devices = self._devices.setdefault(rpc_key, {})
        if len(devices) >= self.max_waiting_per_key:
            self._cleanup(self._devices, rpc_key)
            return waiter, Outcome("duplicate")
        waiter.matchkey = new_matchkey(rpc_key, self._by_matchkey)
        devices[waiter] = None
        self._by_matchkey[waiter.matchkey] = waiter
        return waiter, Outcome("wait")

    def add_client(self, handle, key: str, matchkey: str) -> tuple[Waiter, Outcome]:
        waiter = Waiter(handle, key, matchkey, False)
        device = self._by_matchkey.get(matchkey)
        if device is None and self._devices.get(matchkey):
            devices = self._devices[matchkey]
            device = next((d for d in devices if not self.promised(d)), next(iter(devices)))
        if device is not None:
            self.remove(device)
            return waiter, Outcome("pair", device)
        if matchkey in self._retired:
            return waiter, Outcome("mismatch")
        clients = self._clients.setdefault(matchkey, {})
        if len(clients) >= self.max_waiting_per_key:
            self._cleanup(self._clients, matchkey)
            return waiter, Outcome("duplicate")
        clients[waiter] = None
        return waiter, Outcome("wait")

    # -- departures and renames --------------------------------------------
    def remove(self, waiter: Waiter) -> bool:
        """Forget a waiter (paired, gone or timed out). True if it was still waiting."""
        if waiter.is_device:
            if self._by_matchkey.get(waiter.matchkey) is not waiter:
                return False
            del self._by_matchkey[waiter.matchkey]
            self._retire(waiter.matchkey)
            self._discard(self._devices, waiter)
            return True
        return self._discard(self._clients, waiter)

    def rename(self, device: Waiter) -> str:
        """Give a waiting device a fresh match key; the old one answers MISMATCH from now on."""
        del self._by_matchkey[device.matchkey]
        self._retire(device.matchkey)
        device.matchkey = new_matchkey(device.wanted, self._by_matchkey)
        self._by_matchkey[device.matchkey] = device
        return device.matchkey

    # -- views ------------------------------------------------------------
    def devices(self) -> list[Waiter]:
        return list(self._by_matchkey.values())

    def device_keys(self) -> list[str]:
        return sorted(self._devices)

    def waiting_counts(self) -> tuple[int, int]:
        return len(self._by_matchkey), sum(len(c) for c in self._clients.values())

    # -- internals --------------------------------------------------------
    def _retire(self, matchkey: str) -> None:
        self._retired[matchkey] = None
        while len(self._retired) > RETIRED_MEMORY:
            self._retired.popitem(last=False)

    @staticmethod
    def _cleanup(pools: dict, key: str) -> None:
        if not pools.get(key):
            pools.pop(key, None)

    def _discard(self, pools: dict, waiter: Waiter) -> bool:
        pool = pools.get(waiter.wanted)
        if pool is None or waiter not in pool:
            return False
        del pool[waiter]
        self._cleanup(pools, waiter.wanted)
        return True
