"""One TCP peer of the proxy until it is paired: drives its opening (``wire/opening.py``), then waits.

The socket is driven directly with the event loop's ``add_reader`` (no asyncio
transport), so that on pairing it can be handed to a relay as is.  At a TLS proxy
the bytes read go through the peer's :class:`~.tls.TLSLayer` first (the TLS
handshake, then the key), and the layer goes to the relay with the socket.
While waiting, a peer is still read: EOF means it left, and any byte means it
broke the protocol (TVM peers send nothing before the pairing reply).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time

from ..errors import ProtocolError
from ..netutil import enable_keepalive
from ..wire.handshake import MAX_KEY_BYTES
from ..wire.opening import (Accept, DataReceived, OpeningMachine, Refusal, Reject, Send, TimerFired,
                            TLSEstablished, TLSFailed)
from ..wire.opening import State as OpeningState
from . import websocket as ws
from .tls import TLSLayer

logger = logging.getLogger(__name__)

_REFUSALS = {
    Refusal.PLAINTEXT: "it speaks plain TCP, and this proxy takes TLS peers only",
    Refusal.TLS_FAILED: "TLS handshake failed ({})",
    Refusal.TLS_UNEXPECTED: "it speaks TLS, and this proxy has TLS off (--tls-cert turns it on)",
    Refusal.BAD_PREAMBLE: "{}",
    Refusal.TIMEOUT: "no complete handshake within {timeout:g}s",
}
"""How the proxy logs a refusal of a peer's opening (as the reason it closes the peer)."""

_READ_BYTES = MAX_KEY_BYTES + 16


class PeerConnection:
    decoder = None  # a WebSocket peer's frame decoder (WebSocketConnection)
    read_bytes = _READ_BYTES

    def __init__(self, service, sock: socket.socket, addr, tls: ssl.SSLContext | None = None) -> None:
        self._service = service
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.sock = sock
        self.name = f"{addr[0]}:{addr[1]}" if addr else "?"
        config = service.opening if tls is None else service.opening._replace(tls=True)
        self.opening = OpeningMachine(config, time.monotonic())
        self.waiter = None
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.handed_over = False
        self.tls = TLSLayer(tls) if tls is not None else None
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_keepalive(sock)
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(self.read_bytes)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        if not data:
            self._lost()
            return
        if self.tls is not None:
            data = self._decrypt(data)
            if not data:
                return
        self._received(data)

    def _decrypt(self, raw: bytes) -> bytes:
        """Plaintext from a TLS peer's bytes; sends what TLS answers (the handshake)."""
        opening = self.opening
        if opening.state is OpeningState.SNIFF and not self._opening(DataReceived(raw)):
            return b""
        try:
            data = self.tls.receive(raw)
        except ssl.SSLError as exc:
            self._send_raw(self.tls.take())       # the alert that tells the peer why
            if opening.state is OpeningState.TLS:
                self._opening(TLSFailed(str(exc.reason or exc)))
            else:
                self.fail(f"broken TLS stream: {exc}")
            return b""
        self._send_raw(self.tls.take())
        if self.tls.closed:
            self._lost()
            return b""
        if opening.state is OpeningState.TLS and self.tls.handshake_done:
            self._opening(TLSEstablished())
        return bytes(data)

    def _received(self, data: bytes) -> None:
        """Stream bytes from the peer: its opening, then nothing until it is paired."""
        if self.opening.done:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
        else:
            self._opening(DataReceived(data))

    def _opening(self, event) -> bool:
        """Drive the opening machine (wire/opening.py) with ``event``; False once it refused
        the peer (which is closed then)."""
        for action in self.opening.handle(event, time.monotonic()):
            kind = type(action)
            if kind is Send:
                self.send_stream(action.data)
            elif kind is Accept:
                if action.leftover:
                    self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
                else:
                    self._service.handshake_done(self, action.key)
            elif kind is Reject:
                if action.refusal is Refusal.AUTH_FAILED:
                    logger.warning("refusing %s: it does not know the auth token", self.name)
                    self.refuse(action.reply)
                else:
                    self._send_raw(action.reply)     # PLAINTEXT_REFUSAL: in plain TCP, before any TLS
                    self.fail(_REFUSALS[action.refusal].format(action.detail, timeout=self.opening.config.timeout),
                              gently=action.gently)
                return False
        return True

    def opening_timer(self) -> None:
        """The opening's deadline has come (by the loop's clock): refuse the peer if it has not
        finished by the machine's, else look again then."""
        self.timer = None
        if not self._opening(TimerFired()) or self.closed or self.opening.done:
            return
        self.timer = self._loop.call_at(self.opening.deadline, self.opening_timer)

    def send_stream(self, data: bytes) -> None:
        """Bytes of the RPC stream before pairing (framed by a WebSocket peer)."""
        self._send_quietly(data)

    def hand_over(self) -> socket.socket:
        """Stop watching the socket and give it to the relay."""
        self._cancel_timer()
        self._loop.remove_reader(self.sock.fileno())
        self.handed_over = True
        return self.sock

    def refuse(self, reply: bytes) -> None:
        self._send_quietly(reply)
        self.close()

    def _send_quietly(self, data: bytes) -> None:
        """Small replies into an idle socket always fit; a peer that vanished is noticed on read."""
        if self.tls is not None:
            self.tls.send(data)
            data = self.tls.take()
        self._send_raw(data)

    def _send_raw(self, data: bytes) -> None:
        if not data:
            return
        try:
            self.sock.send(data)
        except OSError:
            pass

    def fail(self, reason: str, gently: bool = False) -> None:
        logger.warning("closing %s: %s", self.name, reason)
        self.close(gently)

    def close(self, gently: bool = False) -> None:
        """``gently``: end our side first and take what the peer sent, so that our last
        bytes (a refusal, a TLS alert) are not lost to the reset a close with unread bytes sends."""
        if self.closed or self.handed_over:
            return
        self.closed = True
        self._cancel_timer()
        self._loop.remove_reader(self.sock.fileno())
        if gently:
            try:
                self.sock.shutdown(socket.SHUT_WR)
                for _ in range(16):          # what has arrived, not what a flood keeps sending
                    if not self.sock.recv(65536):
                        break
            except OSError:          # nothing more to read now (or the peer is gone)
                pass
        self.sock.close()
        self._service.connection_closed(self)

    def _lost(self) -> None:
        self._service.peer_left(self)
        self.close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class WebSocketConnection(PeerConnection):
    """A peer on the web port: an HTTP upgrade, then the same stream in binary messages.

    ``decoder`` (kept for the relay) holds any partial frame when the peer is paired.
    """

    read_bytes = ws.MAX_REQUEST_BYTES + 1024

    def __init__(self, service, sock: socket.socket, addr) -> None:
        super().__init__(service, sock, addr)
        self.name = f"ws:{self.name}"
        self._upgrade: ws.UpgradeRequestParser | None = ws.UpgradeRequestParser()
        self.decoder: ws.FrameDecoder | None = None

    def _received(self, data: bytes) -> None:
        if self._upgrade is not None:
            try:
                request = self._upgrade.feed(data)
            except ws.UpgradeRejected as exc:
                self._send_quietly(exc.response)
                self.fail(str(exc))
                return
            if request is None:
                return
            self._upgrade = None
            self.decoder = ws.FrameDecoder()
            self._send_quietly(ws.accept_response(request))
            data = request.leftover
        try:
            events = self.decoder.feed(data)
        except ProtocolError as exc:
            self._send_quietly(ws.close_frame(ws.CLOSE_PROTOCOL_ERROR, str(exc)))
            self.fail(str(exc))
            return
        for event in events:
            if self.closed or self.handed_over:
                return
            if isinstance(event, ws.Data):
                super()._received(event.payload)
            elif isinstance(event, ws.Ping):
                self._send_quietly(ws.encode_frame(ws.PONG, event.payload))
            elif isinstance(event, ws.Close):
                self._send_quietly(ws.close_frame())
                self._lost()

    def refuse(self, reply: bytes) -> None:
        super().refuse(ws.encode_frame(ws.BINARY, reply) + ws.close_frame())

    def send_stream(self, data: bytes) -> None:
        self._send_quietly(ws.encode_frame(ws.BINARY, data))
