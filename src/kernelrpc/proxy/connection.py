"""One TCP peer of the proxy until it is paired: reads the handshake preamble, then waits.

The socket is driven directly with the event loop's ``add_reader`` (no asyncio
transport), so that on pairing it can be handed to :class:`~.relay.Relay` as is.
While waiting, a peer is still read: EOF means it left, and any byte means it
broke the protocol (TVM peers send nothing before the pairing reply).
"""
from __future__ import annotations

import asyncio
import logging
import socket

from ..errors import ProtocolError
from ..rpc.handshake import MAX_KEY_BYTES, PreambleParser

logger = logging.getLogger(__name__)

_READ_BYTES = MAX_KEY_BYTES + 16
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))


def enable_keepalive(sock: socket.socket) -> None:
    """Notice peers that vanish without closing (a NAT box rebooted) within about a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class PeerConnection:
    def __init__(self, service, sock: socket.socket, addr) -> None:
        self._service = service
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.sock = sock
        self.name = f"{addr[0]}:{addr[1]}" if addr else "?"
        self._parser: PreambleParser | None = PreambleParser()
        self.waiter = None
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.handed_over = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_keepalive(sock)
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(_READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        if not data:
            self._lost()
            return
        if self._parser is None:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        try:
            key = self._parser.feed(data)
        except ProtocolError as exc:
            self.fail(str(exc))
            return
        if key is None:
            return
        unused, self._parser = self._parser.unused, None
        if unused:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        self._service.handshake_done(self, key)

    def hand_over(self) -> socket.socket:
        """Stop watching the socket and give it to the relay."""
        self._cancel_timer()
        self._loop.remove_reader(self.sock.fileno())
        self.handed_over = True
        return self.sock

    def refuse(self, reply: bytes) -> None:
        """Best effort: a few bytes into an idle socket always fit; then close."""
        try:
            self.sock.send(reply)
        except OSError:
            pass
        self.close()

    def fail(self, reason: str) -> None:
        logger.warning("closing %s: %s", self.name, reason)
        self.close()

    def close(self) -> None:
        if self.closed or self.handed_over:
            return
        self.closed = True
        self._cancel_timer()
        self._loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self._service.connection_closed(self)

    def _lost(self) -> None:
        self._service.peer_left(self)
        self.close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
