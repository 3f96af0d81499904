"""One TCP peer of the proxy: reads the handshake preamble, then relays raw bytes.

The relay is an asyncio ``BufferedProtocol``: the kernel reads straight into a
large buffer and the bytes go to the partner's transport in the same callback,
so the per-chunk cost is one ``recv_into`` and one ``send``, whatever the RPC
messages look like.  Flow control is asyncio's: when the partner's write buffer
passes the high-water mark, its ``pause_writing`` stops reading this side, and
``resume_writing`` starts it again, so memory per pair stays bounded.
"""
from __future__ import annotations

import asyncio
import logging

from ..errors import ProtocolError
from ..rpc.handshake import PreambleParser

logger = logging.getLogger(__name__)

HANDSHAKE_BUFFER = 8192
RELAY_BUFFER = 1 << 20
WRITE_HIGH_WATER = 4 << 20
WRITE_LOW_WATER = 1 << 20


class PeerConnection(asyncio.BufferedProtocol):
    """States: handshake -> waiting -> relaying -> closed."""

    def __init__(self, service) -> None:
        self._service = service
        self._parser: PreambleParser | None = PreambleParser()
        self._buf = bytearray(HANDSHAKE_BUFFER)
        self._view = memoryview(self._buf)
        self.transport: asyncio.Transport | None = None
        self.peer: PeerConnection | None = None
        self.waiter = None
        self.timer: asyncio.TimerHandle | None = None
        self.name = "?"
        self.closed = False

    # -- asyncio callbacks ------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peername = transport.get_extra_info("peername")
        self.name = f"{peername[0]}:{peername[1]}" if peername else "?"
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self._service.connection_opened(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        peer = self.peer
        if peer is not None:
            peer.transport.write(self._view[:nbytes])
            if peer.transport.get_write_buffer_size():
                # The transport may keep a view of our buffer: hand it over, read into a new one.
                self._buf = bytearray(RELAY_BUFFER)
                self._view = memoryview(self._buf)
            return
        if self._parser is None:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        try:
            key = self._parser.feed(bytes(self._view[:nbytes]))
        except ProtocolError as exc:
            self.fail(str(exc))
            return
        if key is None:
            return
        unused = self._parser.unused
        self._parser = None
        if unused:
            self.fail("sent data before it was paired (TVM peers wait for the pairing reply)")
            return
        self._service.handshake_done(self, key)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        peer, self.peer = self.peer, None
        if peer is not None:
            peer.peer = None
            peer.transport.close()
        self._service.connection_closed(self, exc)

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and not self.peer.closed:
            self.peer.transport.resume_reading()

    # -- used by the service ----------------------------------------------
    def start_relay(self, peer: "PeerConnection") -> None:
        self.peer = peer
        self._buf = bytearray(RELAY_BUFFER)
        self._view = memoryview(self._buf)

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def fail(self, reason: str) -> None:
        logger.warning("closing %s: %s", self.name, reason)
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._service.release(self)
            self.transport.close()
