"""Accepting connections on a listening socket without spinning when the process runs short.

``accept()`` fails with EMFILE/ENFILE (no descriptor left), ENOBUFS or ENOMEM while the
connection stays queued, so a level-triggered selector reports the listener ready again at
once: retrying straight away is a busy loop, and logging each failure floods the log. As
trio does, :class:`Acceptor` stops watching the listener for :data:`RETRY_AFTER` seconds on
those errors (the queued peers wait in the kernel's backlog) and logs the shortage once, and
once more when accepting works again. Errors that mean one peer left before it was taken
(ECONNABORTED and friends) skip that peer; any other error pauses the listener the same
way rather than ending the service. asyncio's own ``create_server`` pauses a whole
second and logs every failure with a traceback, so the tracker and the proxy use
:func:`watch` instead; the device server's selector loop drives an :class:`Acceptor` itself.

Standard library only: the device server uses it.
"""
from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

RETRY_AFTER = 0.1
"""Seconds the listener is left alone after a capacity error (trio's figure)."""

CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

PEER_GONE_ERRNOS = frozenset(getattr(errno, name) for name in (
    "ECONNABORTED", "ECONNRESET", "EPROTO", "EPERM", "ENETDOWN", "ENETUNREACH", "EHOSTDOWN",
    "EHOSTUNREACH", "ENONET", "ENOPROTOOPT", "EOPNOTSUPP", "ETIMEDOUT") if hasattr(errno, name))
"""accept() errors about one queued peer (it left, or a firewall refused it): take the next."""


class Acceptor:
    """Takes connections from one non-blocking listener and pauses it while resources are short.

    After :meth:`accept` returns None with :attr:`paused_until` set, stop watching the
    listener and call :meth:`resume` at that (``time.monotonic``) time.
    """

    def __init__(self, listener: socket.socket, name: str = "") -> None:
        self.listener = listener
        self.name = name or "%s:%s" % listener.getsockname()[:2]
        self.paused_until: float | None = None
        self._short_since: float | None = None  # the first capacity error of this shortage
        self._retries = 0

    def accept(self) -> tuple[socket.socket, object] | None:
        """The next queued connection as ``(sock, addr)``; None when none is queued, or when
        accept failed, mostly for want of descriptors or memory (then :attr:`paused_until` is set)."""
        while True:
            try:
                conn = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                if exc.errno in PEER_GONE_ERRNOS:
                    continue
                self._pause(exc)  # CAPACITY_ERRNOS, or an error no retry at once could cure either
                return None
            if self._short_since is not None:
                log.warning("accepting on %s again after %.1f s (%d retries)", self.name,
                            time.monotonic() - self._short_since, self._retries)
                self._short_since = None
            return conn

    def resume(self) -> None:
        self.paused_until = None

    def _pause(self, exc: OSError) -> None:
        now = time.monotonic()
        self.paused_until = now + RETRY_AFTER
        if self._short_since is None:
            self._short_since = now
            self._retries = 0
            log.warning("accept on %s failed: %s; retrying every %g s until it works "
                        "(logged once)", self.name, exc, RETRY_AFTER)
        else:
            self._retries += 1


def watch(loop, acceptor: Acceptor, on_connection, max_per_turn: int = 128) -> Callable[[], None]:
    """Call ``on_connection(sock, addr)`` for each connection ``acceptor`` takes, on the
    asyncio ``loop``; returns a function that stops watching.

    At most ``max_per_turn`` connections are taken per readiness event, so a flood of
    connects cannot starve the loop's other work.
    """
    fd = acceptor.listener.fileno()
    state = {"timer": None, "watching": False, "stopped": False}

    def readable() -> None:
        for _ in range(max_per_turn):
            conn = None if state["stopped"] else acceptor.accept()
            if conn is None:
                break
            on_connection(*conn)
        if acceptor.paused_until is not None and not state["stopped"]:
            loop.remove_reader(fd)
            state["watching"] = False
            state["timer"] = loop.call_at(loop.time() + RETRY_AFTER, start)

    def start() -> None:
        state["timer"] = None
        acceptor.resume()
        loop.add_reader(fd, readable)
        state["watching"] = True

    def stop() -> None:
        state["stopped"] = True
        if state["timer"] is not None:
            state["timer"].cancel()
        if state["watching"]:
            loop.remove_reader(fd)
            state["watching"] = False

    start()
    return stop
