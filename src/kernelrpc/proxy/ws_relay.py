"""A relay buffer for pairs with a WebSocket side: frames come off and go on on the way.

Same interface as :class:`~.relay.CopyBuffer`, so :class:`~.relay.PumpRelay` drives it
with the same backpressure: a direction reads at most as much as its buffer has
room for (a frame's payload is never larger than its bytes on the wire, and
framing adds at most ``_MAX_HEADER`` bytes per read).
"""
from __future__ import annotations

import socket

from . import websocket as ws
from .relay import QueuedBuffer

_MAX_HEADER = 10  # server frames are unmasked: 2 + 8 length bytes at most


class WebSocketBuffer(QueuedBuffer):
    """One direction ``src -> dst`` where ``src`` (``decoder`` given) or ``dst`` (``encode``)
    or both speak WebSocket; ``reverse`` is the other direction, which carries our
    answers to ``src``'s pings."""

    def __init__(self, decoder: ws.FrameDecoder | None, encode: bool) -> None:
        super().__init__()
        self._decoder = decoder
        self._encode = encode
        self.reverse: WebSocketBuffer | None = None
        self.src_closed = False  # src sent a close frame: the direction ends as at EOF

    @property
    def pending(self) -> int:
        return self.queued

    @property
    def full(self) -> bool:
        return self.pending + _MAX_HEADER >= self.capacity

    def put(self, data: bytes) -> None:
        """Queue bytes of the stream (the pairing reply, or what ``src`` sent) for ``dst``."""
        if self._encode:
            self._out += ws.frame_header(ws.BINARY, len(data))
        self._out += data

    def put_frame(self, frame: bytes) -> None:
        """Queue a control frame for a WebSocket ``dst``, between whole data frames."""
        self._out += frame

    def fill(self, src: socket.socket) -> int | None:
        if self.src_closed:
            return 0
        if self.full:
            return None
        try:
            raw = src.recv(self.capacity - self.pending - _MAX_HEADER)
        except BlockingIOError:
            return None
        if not raw:
            return 0
        data = raw if self._decoder is None else self._unframe(raw)
        if data:
            self.put(data)
        return len(raw)

    def _unframe(self, raw: bytes) -> bytes:
        """Payload bytes of ``raw``; answers pings on the reverse direction, notes a close.

        Raises:
            ProtocolError: ``src`` broke the WebSocket protocol (the relay ends the pair).
        """
        chunks = []
        for event in self._decoder.feed(raw):
            if isinstance(event, ws.Data):
                chunks.append(event.payload)
            elif isinstance(event, ws.Ping):
                self.reverse.put_frame(ws.encode_frame(ws.PONG, event.payload))
            elif isinstance(event, ws.Close):
                self.src_closed = True
        return b"".join(chunks)

    def drain(self, dst: socket.socket) -> None:
        self.send_queued(dst)

    def farewell(self, dst: socket.socket) -> None:
        """When the pair ends: a close frame to a WebSocket ``dst``, if whole frames went before."""
        if not self._encode:
            return
        try:
            self.drain(dst)
            if not self.pending:
                dst.send(ws.close_frame())
        except OSError:
            pass


def websocket_buffers(a_decoder: ws.FrameDecoder | None, b_decoder: ws.FrameDecoder | None):
    """The (a -> b, b -> a) buffers for a pair; a side with a decoder speaks WebSocket."""
    a_to_b = WebSocketBuffer(a_decoder, encode=b_decoder is not None)
    b_to_a = WebSocketBuffer(b_decoder, encode=a_decoder is not None)
    a_to_b.reverse, b_to_a.reverse = b_to_a, a_to_b
    return a_to_b, b_to_a
