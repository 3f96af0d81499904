"""Moving bytes between two paired sockets, with bounded buffers and no per-message work.

Every relay the proxy runs is a :class:`SessionRelay`: the native loop
(``native_relay.py``) and the Python :class:`PumpRelay` here, whose buffers make it
a splice, copy, WebSocket or TLS relay.  ``relays.py`` chooses among them.

Each direction is a :class:`Pump` from one socket to the other through a bounded
buffer.  On Linux the buffer is a pipe and the bytes move with ``splice(2)``: the
kernel hands socket pages to the pipe and on to the other socket, and they never
enter Python.  Elsewhere (or with ``--relay copy``) a 1 MiB ``bytearray`` with
``recv_into``/``send`` does the same job.  Backpressure is the buffer's bound: a
pump stops reading its source while its buffer is full, so a slow reader costs at
most one buffer per direction.  When either side ends, whatever is buffered
towards the other side is delivered, then both are closed (as TVM's proxy does).
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
from typing import Protocol, runtime_checkable

from ..errors import ProtocolError

logger = logging.getLogger(__name__)

BUFFER_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)

SPLICE_AVAILABLE = hasattr(os, "splice")


@runtime_checkable
class SessionRelay(Protocol):
    """One paired session's relay, whatever moves the bytes.

    Built with the pairing replies already queued (``to_a``, ``to_b``) and an ``on_close``
    callback; owns both sockets from then on.
    """

    kind: str
    """What moves the bytes: ``native``, ``splice``, ``copy``, ``copy (WebSocket)``, ``copy (TLS)``."""

    def start(self) -> None:
        """Begin relaying (the queued pairing replies go first)."""

    def close(self) -> None:
        """End the session: stop relaying and close both sockets (at once, or by ``wait_closed``)."""

    async def wait_closed(self) -> None:
        """Return once both sockets are closed and ``on_close`` has run."""

    @property
    def bytes_moved(self) -> tuple[int, int]:
        """Bytes read from a and from b (the native relay knows them once it has ended)."""


class RelayBuffer:
    """What :class:`PumpRelay` asks of a direction's buffer besides ``fill``/``drain``/``put``."""

    src_closed = False  # set by buffers that see the end inside the stream (a close frame)

    def farewell(self, dst: socket.socket) -> None:
        """Last bytes for ``dst`` when the pair ends; plain streams have none."""


class QueuedBuffer(RelayBuffer):
    """A buffer whose bytes for ``dst`` are made in Python (WebSocket frames, TLS records) and wait
    in one queue until ``dst`` takes them."""

    def __init__(self) -> None:
        self._out = bytearray()
        self._sent = 0
        self.capacity = BUFFER_BYTES

    @property
    def queued(self) -> int:
        return len(self._out) - self._sent

    def send_queued(self, dst: socket.socket) -> None:
        """Send what ``dst`` takes without blocking; the queue empties once all went."""
        while self._sent < len(self._out):
            try:
                self._sent += dst.send(memoryview(self._out)[self._sent:])
            except BlockingIOError:
                return
        del self._out[:]
        self._sent = 0

    def close(self) -> None:
        self._out = bytearray()


class PipeBuffer(RelayBuffer):
    """A kernel pipe between two sockets; bytes move with splice(2)."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.fcntl(self._w, _F_SETPIPE_SZ, BUFFER_BYTES)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: keep the default
        self.capacity = fcntl.fcntl(self._w, _F_GETPIPE_SZ)
        self.pending = 0
        self._stalled = False  # the pipe refused more although ``pending < capacity``

    @property
    def full(self) -> bool:
        return self._stalled or self.pending >= self.capacity

    def put(self, data: bytes) -> None:
        """Queue a few bytes of our own (the pairing reply) ahead of the relayed stream."""
        os.write(self._w, data)
        self.pending += len(data)

    def fill(self, src: socket.socket) -> int | None:
        """Read what the source has (up to the free room): bytes moved, 0 at EOF, None if none."""
        if self.full:
            return None
        try:
            n = os.splice(src.fileno(), self._w, self.capacity - self.pending, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            # Either the socket is empty or the pipe ran out of slots (partly filled pages).
            self._stalled = self.pending > 0
            return None
        self.pending += n
        return n

    def drain(self, dst: socket.socket) -> None:
        while self.pending:
            try:
                n = os.splice(self._r, dst.fileno(), self.pending, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                return
            self.pending -= n
            self._stalled = False

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


class CopyBuffer(RelayBuffer):
    """A user-space buffer: ``recv_into`` then ``send``."""

    def __init__(self) -> None:
        self._buf = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self.capacity = BUFFER_BYTES
        self._start = self._end = 0

    @property
    def pending(self) -> int:
        return self._end - self._start

    def put(self, data: bytes) -> None:
        self._view[self._end:self._end + len(data)] = data
        self._end += len(data)

    def fill(self, src: socket.socket) -> int | None:
        if self._end == self.capacity:
            return None
        try:
            n = src.recv_into(self._view[self._end:])
        except BlockingIOError:
            return None
        self._end += n
        return n

    def drain(self, dst: socket.socket) -> None:
        while self._start < self._end:
            try:
                self._start += dst.send(self._view[self._start:self._end])
            except BlockingIOError:
                return
        self._start = self._end = 0

    @property
    def full(self) -> bool:
        return self._end == self.capacity

    def close(self) -> None:
        self._view.release()


class Pump:
    """One direction: ``src`` -> buffer -> ``dst``."""

    def __init__(self, src: socket.socket, dst: socket.socket, buffer) -> None:
        self.src, self.dst, self.buffer = src, dst, buffer
        self.eof = False
        self.moved = 0

    @property
    def wants_read(self) -> bool:
        return not self.eof and not self.buffer.full

    @property
    def wants_write(self) -> bool:
        return self.buffer.pending > 0


def buffer_pair(make) -> tuple:
    """Two buffers from ``make()``; none left open if the second cannot be made."""
    first = make()
    try:
        return first, make()
    except OSError:
        first.close()
        raise


class PumpRelay:
    """Two pumps over one pair of sockets, driven by the event loop's reader/writer callbacks.

    ``buffers`` (a -> b, b -> a) decide how bytes move: :class:`PipeBuffer` (splice),
    :class:`CopyBuffer`, or the WebSocket and TLS buffers; ``kind`` names them.
    """

    def __init__(self, loop, a: socket.socket, b: socket.socket, to_a: bytes, to_b: bytes, *,
                 buffers: tuple, kind: str, on_close=None) -> None:
        self.kind = kind
        self._loop = loop
        self._on_close = on_close
        self._closed = False
        first, second = buffers
        self._pumps = [Pump(a, b, first), Pump(b, a, second)]
        self._pumps[0].buffer.put(to_b)
        self._pumps[1].buffer.put(to_a)
        self._watching: dict[tuple[int, str], bool] = {}

    def start(self) -> None:
        for pump in self._pumps:
            self._flush(pump)

    @property
    def bytes_moved(self) -> tuple[int, int]:
        return self._pumps[0].moved, self._pumps[1].moved

    async def wait_closed(self) -> None:
        """Sockets are closed by :meth:`close` itself."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for (fd, kind), on in self._watching.items():
            if on:
                (self._loop.remove_reader if kind == "r" else self._loop.remove_writer)(fd)
        for pump in self._pumps:
            pump.buffer.farewell(pump.dst)
        for pump in self._pumps:
            pump.src.close()
            pump.buffer.close()
        if self._on_close is not None:
            self._on_close()

    # -- event handling ----------------------------------------------------------
    def _readable(self, pump: Pump) -> None:
        try:
            n = pump.buffer.fill(pump.src)
        except (OSError, ProtocolError) as exc:
            logger.debug("relay read failed: %s", exc)
            self.close()
            return
        if n:
            pump.moved += n
        if n == 0 or pump.buffer.src_closed:
            pump.eof = True
        self._flush(pump)
        other = self._pumps[1] if pump is self._pumps[0] else self._pumps[0]
        if other.wants_write:  # reading may queue an answer the other way (a WebSocket pong)
            self._flush(other)

    def _writable(self, pump: Pump) -> None:
        self._flush(pump)

    def _flush(self, pump: Pump) -> None:
        if self._closed:
            return
        try:
            pump.buffer.drain(pump.dst)
        except OSError as exc:
            logger.debug("relay write failed: %s", exc)
            self.close()
            return
        if pump.eof and not pump.wants_write:
            self.close()  # one side ended and everything it sent has been delivered
            return
        self._watch(pump.src.fileno(), "r", pump.wants_read, self._readable, pump)
        self._watch(pump.dst.fileno(), "w", pump.wants_write, self._writable, pump)

    def _watch(self, fd: int, kind: str, on: bool, callback, pump: Pump) -> None:
        if self._watching.get((fd, kind), False) == on:
            return
        self._watching[(fd, kind)] = on
        if kind == "r":
            if on:
                self._loop.add_reader(fd, callback, pump)
            else:
                self._loop.remove_reader(fd)
        elif on:
            self._loop.add_writer(fd, callback, pump)
        else:
            self._loop.remove_writer(fd)
