"""The thin socket layer under the session protocol: frames in, frames out, raw streams.

Raw payloads (tensor contents, files) go straight between the socket and the
caller's buffer: ``sendmsg`` of the frame header together with a memoryview,
``recv_into`` a memoryview, so no payload byte is copied by Python.
"""
from __future__ import annotations

import socket

from ..errors import ConnectionLost
from ..runtime.prefault import prefault
from .protocol import DEFAULT_MAX_FRAME_BYTES, FrameReader
from .tls import is_tls_socket

_RECV_CHUNK = 1 << 16
# The first read of a frame: room for any scalar CALL or RETURN and a few tensor handles, and
# small enough that CPython takes the bytes object from its small-object allocator (at most 512
# bytes with the object header) instead of malloc-ing and shrinking 64 KiB on every call.
FIRST_READ = 448
PEER_CLOSED = "the peer closed the connection"


def receive_failed(exc: OSError) -> ConnectionLost:
    """The ConnectionLost for a receive that raised ``exc`` (kept as its cause: a timeout is told
    apart by it)."""
    lost = ConnectionLost(f"connection lost while receiving: {exc}")
    lost.__cause__ = exc
    return lost


class FramedSocket:
    """Blocking frame I/O over a connected socket. Socket errors surface as ConnectionLost."""

    def __init__(self, sock: socket.socket, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 initial: bytes = b"", reader: FrameReader | None = None) -> None:
        """``reader``: the session connection that takes the bytes (connection.py), else a frame
        reader of ``max_frame_bytes``."""
        self.sock = sock
        self.reader = FrameReader(max_frame_bytes) if reader is None else reader
        self._scratch = bytearray(_RECV_CHUNK)
        self._gather = not is_tls_socket(sock)  # TLS sockets have no sendmsg
        if initial:
            self.reader.feed(initial)

    def send(self, data) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnectionLost(f"connection lost while sending: {exc}") from exc

    def send_with_raw(self, head: bytes, raw) -> None:
        """Send ``head`` followed by the bytes of ``raw`` (any buffer) without copying them."""
        raw = memoryview(raw).cast("B")
        try:
            if len(raw) <= _RECV_CHUNK:
                self.sock.sendall(head + raw)
                return
            if not self._gather:
                self.sock.sendall(head)
                self.sock.sendall(raw)
                return
            sent = self.sock.sendmsg([head, raw])
            if sent < len(head):
                self.sock.sendall(head[sent:])
                sent = len(head)
            if sent - len(head) < len(raw):
                self.sock.sendall(raw[sent - len(head):])
        except OSError as exc:
            raise ConnectionLost(f"connection lost while sending: {exc}") from exc

    def recv_chunk(self) -> bytes | None:
        """One small read (``FIRST_READ``) straight from the socket, or None while frame bytes
        are buffered (``recv_frame`` must take those first).

        The first read of every frame. A request or reply of a measurement loop arrives whole in
        it; the session connection's fast lanes (connection.py: ``call_from_read``,
        ``result_from_read``) decode the chunk, and anything else is handed back with
        ``recv_frame(chunk)``. The server's request loop and the client's channel make this
        read themselves, with the same errors (``receive_failed``, ``PEER_CLOSED``): one Python
        call less per message.
        """
        if self.reader.pending:
            return None
        try:
            data = self.sock.recv(FIRST_READ)
        except OSError as exc:
            raise receive_failed(exc) from exc
        if not data:
            raise ConnectionLost(PEER_CLOSED)
        return data

    def recv_frame(self, chunk: bytes | None = None) -> tuple[int, bytes]:
        """The next frame as ``(type, body)``; ``chunk`` is what recv_chunk returned, if called.

        A frame that arrives whole in the first read is taken as it is
        (``FrameReader.whole_frame``); anything else goes through the reader, a frame longer
        than the read at one more read.
        """
        reader = self.reader
        if chunk is None:
            if reader.pending:
                frame = reader.next_frame()
                if frame is not None:
                    return frame
            chunk = self.recv_chunk() if not reader.pending else None
        if chunk is not None:
            frame = reader.whole_frame(chunk)
            if frame is not None:
                return frame
            reader.feed(chunk)
        while True:
            frame = reader.next_frame()
            if frame is not None:
                return frame
            self._fill()

    def _fill(self) -> None:
        try:
            n = self.sock.recv_into(self._scratch)
        except OSError as exc:
            raise ConnectionLost(f"connection lost while receiving: {exc}") from exc
        if n == 0:
            raise ConnectionLost("the peer closed the connection")
        self.reader.feed(memoryview(self._scratch)[:n])

    def recv_raw_into(self, target) -> None:
        """Fill ``target`` (a writable buffer) with the next raw bytes of the stream."""
        view = memoryview(target).cast("B")
        head = self.reader.take(len(view))
        view[:len(head)] = head
        pos = len(head)
        prefault(view[pos:])  # pages mapped now, not one fault at a time inside recv_into
        try:
            while pos < len(view):
                n = self.sock.recv_into(view[pos:])
                if n == 0:
                    raise ConnectionLost("the peer closed the connection in the middle of a transfer")
                pos += n
        except OSError as exc:
            raise ConnectionLost(f"connection lost while receiving: {exc}") from exc

    def discard_raw(self, nbytes: int) -> None:
        """Read and drop ``nbytes`` raw bytes (a refused transfer keeps the stream in step)."""
        chunk = bytearray(min(nbytes, 1 << 20))
        while nbytes:
            part = memoryview(chunk)[:min(nbytes, len(chunk))]
            self.recv_raw_into(part)
            nbytes -= len(part)
