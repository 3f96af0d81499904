"""A tracker and device servers on loopback for one session, when no lab is at hand.

``connect_or_start(host, port, key)`` is what a notebook or an example opened for the first
time needs: the tracker at ``host:port`` when one listens there, else a tracker and device
servers of ``key`` started on loopback as users start them (``python -m kernelrpc.tracker``,
``python -m kernelrpc.server``, ports chosen by the OS), said in one line of output, and
stopped when the returned tracker session closes (or the process exits).
"""
from __future__ import annotations

import atexit

from ..rpc.tracker_client import TrackerNotListening, TrackerSession
from .launch import Service

#: The device server's log line once the tracker has its registration.
REGISTERED = r"registered key \S+ at tracker"


class LocalFleet:
    """A tracker and ``devices`` device servers of ``key`` on 127.0.0.1, each ready (its
    ``listening on`` line) and every server registered at the tracker when this returns.

    ``server_args(index)`` are extra options of each server (``["--cpus", "1"]``).
    """

    def __init__(self, key: str, devices: int = 1, server_args=lambda index: [],
                 timeout: float = 60.0):
        if devices < 1:
            raise ValueError(f"a local fleet needs at least one device server, got {devices}")
        self.key = key
        self.services: list[Service] = []
        try:
            self.tracker = self._start("kernelrpc.tracker", ["--host", "127.0.0.1", "--port", "0"],
                                       timeout)
            self.servers = [self._start("kernelrpc.server",
                                        ["--host", "127.0.0.1", "--port", "0", "--key", key,
                                         "--tracker", f"{self.host}:{self.port}",
                                         *server_args(index)], timeout)
                            for index in range(devices)]
            for server in self.servers:
                server.wait_for_line(REGISTERED, timeout)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def _start(self, module: str, args: list[str], timeout: float) -> Service:
        service = Service(module, args, timeout=timeout)
        self.services.append(service)
        return service

    @property
    def host(self) -> str:
        return self.tracker.host

    @property
    def port(self) -> int:
        return self.tracker.port

    def describe(self) -> str:
        count = len(self.servers)
        return (f"a local tracker at {self.host}:{self.port} and {count} device server"
                f"{'s' if count != 1 else ''} with key {self.key!r} "
                f"({', '.join(f'{s.host}:{s.port}' for s in self.servers)})")

    def close(self) -> None:
        """Stop every service (idempotent)."""
        services, self.services = self.services, []
        for service in reversed(services):
            service.stop()
        atexit.unregister(self.close)

    def __enter__(self) -> "LocalFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect_or_start(host: str, port: int, key: str, *, devices: int = 1, server_args=lambda index: [],
                     connect_timeout: float = 5.0, say=print):
    """A :class:`~kernelrpc.rpc.TrackerSession` with the tracker at ``host:port``, or, when
    nothing listens there, with a :class:`LocalFleet` started for the session: ``say`` (print)
    gets one line telling which, and closing the session stops the fleet.

    Only a refused or timed-out connection starts a fleet: a peer at the address that is not a
    tracker, or that refuses our credentials, is an error as it is from ``connect_tracker``.
    """
    try:
        return TrackerSession((host, int(port)), connect_timeout=connect_timeout)
    except TrackerNotListening as exc:
        reason = str(exc)
    fleet = LocalFleet(key, devices, server_args)
    try:
        session = FleetTrackerSession(fleet)
    except BaseException:
        fleet.close()
        raise
    say(f"{reason}: started {fleet.describe()} for this session; they stop when it closes. "
        f"Set KERNELRPC_TRACKER=HOST:PORT to use a lab's tracker instead.")
    return session


class FleetTrackerSession(TrackerSession):
    """A tracker session with a :class:`LocalFleet` that stops when the session closes."""

    def __init__(self, fleet: LocalFleet):
        self.fleet = fleet
        super().__init__((fleet.host, fleet.port))

    def close(self) -> None:
        try:
            super().close()
        finally:
            fleet = getattr(self, "fleet", None)
            if fleet is not None:
                fleet.close()
