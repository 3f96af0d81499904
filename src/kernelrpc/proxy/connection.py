"""One TCP peer of the proxy until it is paired: reads the handshake preamble, then waits.

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

from ..errors import ProtocolError
from ..netutil import enable_keepalive
from ..wire.auth import ServiceAuth
from ..wire.handshake import MAX_KEY_BYTES, PreambleParser
from ..wire.tls import PLAINTEXT_REFUSAL
from . import websocket as ws
from .tls import PlaintextPeer, TLSLayer

logger = logging.getLogger(__name__)

_READ_BYTES = MAX_KEY_BYTES + 16


class PeerConnection:
    decoder = None  # a WebSocket peer's frame decoder (WebSocketConnection)
    read_bytes = _READ_BYTES

    def __init__(self, service, sock: socket.socket, addr, tls: ssl.SSLContext | None = None) -> None:
        self._service = service
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        self.sock = sock
        self.name = f"{addr[0]}:{addr[1]}" if addr else "?"
        self._parser: PreambleParser | None = PreambleParser()
        self._auth: ServiceAuth | None = None
        self._auth_key = ""
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
        try:
            data = self.tls.receive(raw)
        except PlaintextPeer:
            self._send_raw(PLAINTEXT_REFUSAL)
            self.fail("it speaks plain TCP, and this proxy takes TLS peers only", gently=True)
            return b""
        except ssl.SSLError as exc:
            self._send_raw(self.tls.take())       # the alert that tells the peer why
            if self.tls.handshake_done:
                self.fail(f"broken TLS stream: {exc}")
            else:
                self.fail(f"TLS handshake failed ({exc.reason or exc})", gently=True)
            return b""
        self._send_raw(self.tls.take())
        if self.tls.closed:
            self._lost()
            return b""
        return bytes(data)

    def _received(self, data: bytes) -> None:
        """Stream bytes from the peer: the preamble (and, with a token, the answer to our
        challenge), then nothing until it is paired."""
        if self._auth is not None:
            self._read_auth(data)
            return
        if self._parser is None:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        try:
            key = self._parser.feed(data)
        except ProtocolError as exc:
            reason = str(exc)
            if self.tls is None and data[:2] == b"\x16\x03":     # a TLS ClientHello
                reason = "it speaks TLS, and this proxy has TLS off (--tls-cert turns it on)"
            self.fail(reason)
            return
        if key is None:
            return
        unused, self._parser = self._parser.unused, None
        token = self._service.config.auth_token
        if token is not None:
            self._auth_key = key
            self._auth = ServiceAuth(token, key.encode())
            self.send_stream(self._auth.challenge())
            if unused:
                self._read_auth(unused)
            return
        if unused:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        self._service.handshake_done(self, key)

    def _read_auth(self, data: bytes) -> None:
        """The peer's answer to our challenge: only a peer that knows the token reaches pairing."""
        verdict = self._auth.feed(data)
        if verdict is None:
            return
        if not self._auth.ok:
            logger.warning("refusing %s: it does not know the auth token", self.name)
            self.refuse(verdict)
            return
        self.send_stream(verdict)
        auth, self._auth = self._auth, None
        if auth.unused:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        self._service.handshake_done(self, self._auth_key)

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
