"""The device server's connections from ``accept`` until their session starts: the selectors
driver of the opening machine (``wire/opening.py``).

Everything here is non-blocking: a peer that stays silent is dropped at its deadline and never
holds up others, and with TLS (``config.tls``) the TLS handshake runs within the same deadline,
before the RPC handshake (the first byte is looked at, not taken, so that it stays TLS's). A
connection whose opening is accepted stays watched while it waits for its session: bytes it
sends meanwhile are kept for the session (up to 64 KiB), and a hang-up drops it.
"""
from __future__ import annotations

import logging
import selectors
import socket
import ssl
import time
from collections.abc import Callable

from ..acceptor import Acceptor
from ..wire import handshake as H
from ..wire.opening import (Accept, ConnectionClosed, DataReceived, OpeningConfig, OpeningMachine, Preamble,
                            Refusal, Reject, Send, StartTLS, TimerFired, TLSEstablished, TLSFailed)
from ..wire.opening import State as OpeningState
from ..wire.tls import close_gently
from .config import ServerConfig

log = logging.getLogger(__name__)

MAX_EARLY_BYTES = 1 << 16
"""Bytes a peer may send after its opening, before its session starts."""


class Pending:
    """A connection in the middle of the handshake, or waiting for its session."""

    def __init__(self, sock: socket.socket, addr, opening: OpeningMachine) -> None:
        self.sock = sock
        self.peer = "%s:%s" % addr[:2]
        self.opening = opening
        self.key: H.ParsedKey | None = None    # set once its opening is accepted
        self.extra = b""
        self.admitted = 0.0                      # when its key matched (it waits for a slot from then)

    def reply(self, data: bytes) -> bool:
        """Send a short handshake reply; a peer whose buffer is full is not worth waiting for."""
        try:
            return self.sock.send(data) == len(data)
        except OSError:
            return False


def _check_key(key: str) -> H.ParsedKey:
    parsed = H.parse_key(key)
    parsed.timeout  # validates -timeout= now, while we can still refuse cleanly
    return parsed


_REFUSALS = {
    Refusal.PLAINTEXT: "it spoke plain TCP to this TLS server (%s); told it TLS is required",
    Refusal.TLS_FAILED: "the TLS handshake failed: %s",
    Refusal.TLS_UNEXPECTED: "it speaks TLS, and this server runs without TLS (--tls-cert)%.0s",
    Refusal.BAD_PREAMBLE: "%s",
    Refusal.BAD_KEY: "%s",
    Refusal.AUTH_FAILED: "%s",
}
"""How the server logs each refusal (the detail fills the %s)."""


class Openings:
    """Accepts on ``listen_sock`` and drives each connection's opening; ``opened(pending)`` is
    called with each connection whose opening is accepted (``pending.key`` set, ``pending.extra``
    what followed). The owner takes it with :meth:`take` when its session starts."""

    def __init__(self, config: ServerConfig, selector: selectors.BaseSelector, listen_sock: socket.socket,
                 opened: Callable[[Pending], None]) -> None:
        self.config = config
        self.selector = selector
        self.listen_sock = listen_sock
        self.pending: dict[socket.socket, Pending] = {}
        self.tls = config.tls.server_context() if config.tls is not None else None
        self._opened = opened
        self._config = OpeningConfig(Preamble.RPC, tls=self.tls is not None, auth_token=config.auth_token,
                                     timeout=config.handshake_timeout, check_key=_check_key)
        listen_sock.setblocking(False)
        self.acceptor = Acceptor(listen_sock)
        selector.register(listen_sock, selectors.EVENT_READ, self._accept)

    def next_deadline(self) -> float | None:
        deadlines = [p.opening.deadline for p in self.pending.values() if p.key is None]
        if self.acceptor.paused_until is not None:
            deadlines.append(self.acceptor.paused_until)
        return min(deadlines, default=None)

    def tick(self, now: float) -> None:
        for pending in [p for p in self.pending.values() if p.key is None and now >= p.opening.deadline]:
            self._opening(pending, TimerFired())
        if self.acceptor.paused_until is not None and now >= self.acceptor.paused_until:
            self.acceptor.resume()
            self.selector.register(self.listen_sock, selectors.EVENT_READ, self._accept)

    def take(self, pending: Pending) -> bool:
        """Stop watching ``pending`` (its session starts); False if it hung up meanwhile."""
        if self.pending.pop(pending.sock, None) is None:
            return False
        self.selector.unregister(pending.sock)
        return True

    def drop(self, pending: Pending) -> None:
        self.take(pending)
        pending.sock.close()

    def close(self) -> None:
        for pending in list(self.pending.values()):
            self.drop(pending)
        self.listen_sock.close()

    # ------------------------------------------------------------ the driver

    def _accept(self, listen_sock: socket.socket) -> None:
        conn = self.acceptor.accept()
        if conn is None:
            if self.acceptor.paused_until is not None:  # out of descriptors: serve the sessions we have
                self.selector.unregister(listen_sock)
            return
        sock, addr = conn
        if len(self.pending) >= self.config.max_pending and not self._evict_unfinished_handshake():
            log.warning("refusing %s: %d connections already wait for a session", addr, len(self.pending))
            sock.close()
            return
        sock.setblocking(False)
        self.pending[sock] = Pending(sock, addr, OpeningMachine(self._config, time.monotonic()))
        self.selector.register(sock, selectors.EVENT_READ, self._read)

    def _read(self, sock: socket.socket) -> None:
        pending = self.pending[sock]
        state = pending.opening.state
        if state is OpeningState.SNIFF or state is OpeningState.TLS:
            if not self._open_tls(pending):
                return
            sock = pending.sock
        while True:
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                data = b""
            self._received(pending, data)
            # bytes TLS decrypted ahead wait in the SSL object, where the selector cannot see them
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending() and self.pending.get(sock) is pending):
                return

    def _open_tls(self, pending: Pending) -> bool:
        """Look at the first byte (left in the socket), then advance the TLS handshake by what
        has arrived; True once it is done."""
        if pending.opening.state is OpeningState.SNIFF:
            try:
                first = pending.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                first = b""
            self._opening(pending, DataReceived(first) if first else ConnectionClosed())
            if pending.opening.state is not OpeningState.TLS:
                return False
        sock = pending.sock
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.selector.modify(sock, selectors.EVENT_READ, self._read)
            return False
        except ssl.SSLWantWriteError:
            self.selector.modify(sock, selectors.EVENT_WRITE, self._read)
            return False
        except OSError as exc:      # ssl.SSLError included: no or a wrong client certificate, not TLS
            self._opening(pending, TLSFailed(str(exc)))
            return False
        self._opening(pending, TLSEstablished())
        self.selector.modify(sock, selectors.EVENT_READ, self._read)
        return True

    def _start_tls(self, pending: Pending) -> bool:
        """Put the TLS socket in the plain one's place (its first bytes are still unread)."""
        sock = pending.sock
        self.take(pending)
        try:
            pending.sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError as exc:
            log.info("dropping %s: %s", pending.peer, exc)
            sock.close()
            return False
        self.pending[pending.sock] = pending
        self.selector.register(pending.sock, selectors.EVENT_READ, self._read)
        return True

    def _received(self, pending: Pending, data: bytes) -> None:
        if not data:
            self.drop(pending)
        elif pending.key is not None:  # bytes sent before our reply: keep them for the session
            pending.extra += data
            if len(pending.extra) > MAX_EARLY_BYTES:
                self.drop(pending)
        else:
            self._opening(pending, DataReceived(data))

    def _opening(self, pending: Pending, event) -> None:
        """Drive the opening machine with ``event``; do what it says."""
        for action in pending.opening.handle(event, time.monotonic()):
            kind = type(action)
            if kind is Send:
                if not pending.reply(action.data):
                    self.drop(pending)
                    return
            elif kind is StartTLS:
                if not self._start_tls(pending):
                    pending.opening.handle(ConnectionClosed(), 0.0)
                    return
            elif kind is Accept:
                pending.key = action.checked
                pending.extra = action.leftover
                self._opened(pending)
            elif kind is Reject:
                self._rejected(pending, action)

    def _rejected(self, pending: Pending, reject: Reject) -> None:
        message = _REFUSALS.get(reject.refusal)
        if message is not None:
            level = logging.INFO if reject.refusal in (Refusal.BAD_PREAMBLE, Refusal.BAD_KEY) else logging.WARNING
            log.log(level, "refusing %s: " + message, pending.peer, reject.detail)
        elif reject.refusal is Refusal.TIMEOUT:
            log.info("dropping %s: no handshake within %.1fs", pending.peer, self.config.handshake_timeout)
        if reject.reply:
            pending.reply(reject.reply)
        if not reject.gently:
            self.drop(pending)
        elif self.take(pending):
            close_gently(pending.sock)      # the refusal or the alert that says why must not be lost to a reset

    def _evict_unfinished_handshake(self) -> bool:
        """Make room by dropping the oldest peer that has not finished its handshake.

        A flood of silent connections then cannot use up the server's descriptors or keep a
        client that completes its handshake promptly from getting in.
        """
        for pending in self.pending.values():
            if pending.key is None:
                log.info("dropping %s: too many unfinished handshakes", pending.peer)
                self.drop(pending)
                return True
        return False
