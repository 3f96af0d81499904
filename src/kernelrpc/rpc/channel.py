"""The client's request/reply channel of one session: framing, error mapping, lifetime, frees.

A :class:`Channel` sends requests (requests.py) and returns their replies: RETURN values, a
CALL's result, or the raw bytes after a DATA frame. A reply that stands for a failure becomes
the error a user can act on (RemoteError with the server's traceback, SessionTimeout,
ServerCrashed, ConnectionLost); once the connection is lost or out of step the channel closes.

Handles dropped by the garbage collector are queued (:meth:`release`) and go out in front of
the next request, in the same write: as one RELEASE without a reply when the server serves it,
else as a FREE whose reply is read first. A finalizer never touches the socket.

The user-facing objects (session, tensor, module, function; client.py and remote.py) use only
the public methods here.
"""
from __future__ import annotations

import threading
import time
from typing import NoReturn

from ..errors import ConnectionLost, ProtocolError, RemoteError, RPCError, SessionTimeout
from . import protocol as P
from .protocol import NOT_ONE_FRAME, decode_result, decode_result_frame, encode_call
from .requests import OPTIONAL_OPS, Free, Op, Shutdown
from .transport import FIRST_READ, PEER_CLOSED, FramedSocket, receive_failed
from .values import decode_values

_PROGRESS_CHUNK = 4 << 20
_TIMEOUT_SLACK = 1.0  # a connection lost this close to the session deadline is the timeout
_MAX_OPS_LISTED = 256
_RETURN = P.RETURN


def served_optional_ops(info: dict) -> frozenset:
    """The optional requests the server lists in its hello (none from servers that predate them)."""
    listed = info.get("ops", [])
    if not isinstance(listed, list) or len(listed) > _MAX_OPS_LISTED:
        raise ProtocolError("session hello reply: ops is not a short list")
    return frozenset(op for op in OPTIONAL_OPS if op.value in listed)


class Channel:
    """Requests and replies over one session's connection. Thread-safe: one request at a time."""

    def __init__(self, sock, info: dict, where: str, initial: bytes = b"", *,
                 progress_min_bytes: int = 16 << 20) -> None:
        self.info = info
        self.address = where
        self.max_frame_bytes = int(info["max_frame_bytes"])
        self.ops = served_optional_ops(info)
        self._release_op = Op.RELEASE in self.ops
        self.conn = FramedSocket(sock, self.max_frame_bytes, initial)
        self.timeout = float(info["session_timeout"])
        self.deadline = time.monotonic() + self.timeout if self.timeout else None
        #: Progress bars for large transfers: None = where someone watches, True/False = always/never.
        self.progress: bool | None = None
        self.progress_min_bytes = progress_min_bytes  # transfers at least this large may show a bar
        self._lock = threading.Lock()
        self._closed = False
        self._released: list = []

    @property
    def closed(self) -> bool:
        return self._closed

    def serves(self, op: Op) -> bool:
        return op not in OPTIONAL_OPS or op in self.ops

    # ------------------------------------------------------------ requests

    def request(self, request) -> list:
        """Send ``request`` and return the values of its RETURN reply."""
        return decode_values(self._exchange(P.encode(request)))

    def call(self, function_id: int, args, to_wire=None) -> object:
        """Call a remote function with ``args``, wire values or made so by ``to_wire``
        (protocol.encode_call); its result as a wire value.

        Fast path (docs/performance.md): a reply that arrives whole in one read is decoded
        straight from it (protocol.decode_result_frame); anything else goes the general way.
        """
        frame = encode_call(function_id, args, self.max_frame_bytes, to_wire)
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost on a path that is timed against raw sockets
        try:
            chunk = self._send_and_read(frame)
            if chunk is not None:
                result = decode_result_frame(chunk, self.max_frame_bytes)
                if result is not NOT_ONE_FRAME:
                    return result
            reply = self._receive(chunk)
            if reply[0] != _RETURN:
                self._fail(reply, _RETURN)
        finally:
            lock.release()
        return decode_result(reply[1])

    def _exchange(self, frame: bytes) -> bytes:
        """Send an encoded request; the body of its RETURN reply."""
        with self._lock:
            reply = self._receive(self._send_and_read(frame))
            if reply[0] != _RETURN:
                self._fail(reply, _RETURN)
        return reply[1]

    def _send_and_read(self, frame: bytes) -> bytes | None:
        """Send a request frame (the queued frees in front) and make the first read of the reply
        (FramedSocket.recv_chunk's, without its call), or None while reply bytes are buffered."""
        if self._released or self._closed:
            frame = self._with_frees(frame)
        conn = self.conn
        try:
            conn.sock.sendall(frame)
        except OSError as exc:
            raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
        if conn.reader.pending:
            return None
        try:
            chunk = conn.sock.recv(FIRST_READ)
        except OSError as exc:
            raise self._lost(receive_failed(exc)) from None
        except KeyboardInterrupt:  # the reply would arrive later and desync the stream
            self.mark_closed()
            raise
        if not chunk:
            raise self._lost(ConnectionLost(PEER_CLOSED))
        return chunk

    def request_with_raw(self, request, view: memoryview, describe) -> list:
        """Send ``request`` followed by the raw bytes of ``view`` (in pieces under a progress bar
        when the transfer is worth one); the values of the RETURN reply."""
        bar = self._transfer_bar(view.nbytes, describe) if view.nbytes >= self.progress_min_bytes else None
        with self._lock:
            if bar is None:
                self._send(P.encode(request), view)
            else:
                with bar:
                    self._send(P.encode(request), b"")
                    for start in range(0, view.nbytes, _PROGRESS_CHUNK):
                        part = view[start:start + _PROGRESS_CHUNK]
                        self._send_raw(part)
                        bar.update(part.nbytes)
            return self.expect(self.receive(), P.RETURN)

    def upload_file(self, request, file, size: int, describe) -> None:
        """Send ``request`` followed by ``size`` bytes of ``file`` (sendfile), and await its RETURN."""
        bar = self._transfer_bar(size, describe)
        with self._lock:
            self._send(P.encode(request), b"")
            sock = self.conn.sock
            try:
                if bar is None:
                    if size:
                        sock.sendfile(file, 0, size)
                else:
                    with bar:
                        sent = 0
                        while sent < size:
                            n = sock.sendfile(file, sent, min(_PROGRESS_CHUNK, size - sent))
                            if not n:
                                raise OSError(f"{file.name} shrank while it was being sent")
                            sent += n
                            bar.update(n)
            except OSError as exc:
                raise self._lost(exc) from None
            self.expect(self.receive(), P.RETURN)

    def fetch(self, request, target, limit: int, describe):
        """Send ``request``, whose reply is DATA and raw bytes, and receive those bytes.

        ``target`` is a writable byte memoryview of the size the reply must announce, or None for
        a new bytearray of the announced size, at most ``limit`` bytes. Returns the target.
        """
        with self._lock:
            self._send(P.encode(request))
            nbytes = self.expect(self.receive(), P.DATA)
            if target is None:
                if nbytes > limit:
                    self.mark_closed()
                    raise ProtocolError(f"the server announces {nbytes} bytes, beyond its own limit of "
                                        f"{limit}; refusing to allocate them")
                out = bytearray(nbytes)
                target = memoryview(out)
            else:
                out = target
                if nbytes != target.nbytes:
                    self.mark_closed()
                    raise ProtocolError(f"server sent {nbytes} bytes where {target.nbytes} were expected")
            self._recv_raw(target, describe)
        return out

    # ------------------------------------------------------------ handles

    def release(self, handle) -> None:
        """Free ``handle`` with the next request (for finalizers: never touches the socket)."""
        if not self._closed:
            self._released.append(handle)

    def free(self, handle) -> None:
        """Free ``handle`` now."""
        if not self._closed:
            self.request(Free((handle,)))

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """End the session; the server removes its workspace."""
        with self._lock:
            if self._closed:
                return
            try:
                self.conn.send(P.encode(Shutdown()))
            except ConnectionLost:
                pass
            self.mark_closed()

    def mark_closed(self) -> None:
        """Close the connection without a word to the server (it is lost or out of step)."""
        self._closed = True
        try:
            self.conn.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------ internals

    def _send(self, frame: bytes, raw=None) -> None:
        """Send a request frame (and raw bytes after it), with the queued frees in front."""
        if self._released or self._closed:
            frame = self._with_frees(frame)
        try:
            if raw is None:
                self.conn.sock.sendall(frame)
            else:
                self.conn.send_with_raw(frame, raw)
        except (OSError, ConnectionLost) as exc:
            raise self._lost(exc if isinstance(exc, ConnectionLost) else
                             ConnectionLost(f"connection lost while sending: {exc}")) from None

    def _with_frees(self, frame: bytes) -> bytes:
        if self._closed:
            raise ConnectionLost(f"the session with {self.address} is closed")
        released, self._released = self._released, []
        if self._release_op:
            return P.encode_request(P.RELEASE, [h.id for h in released]) + frame  # Release's wire values
        try:  # a server without RELEASE answers the FREE: read that reply before the request's
            self.conn.sock.sendall(P.encode(Free(tuple(released))))
        except OSError as exc:
            raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
        try:
            self.expect(self.receive(), P.RETURN)
        except RemoteError:  # the request's own reply would be read as this one's
            self.mark_closed()
            raise
        return frame

    def _send_raw(self, part) -> None:
        try:
            self.conn.sock.sendall(part)
        except OSError as exc:
            raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None

    def receive(self) -> tuple[int, bytes]:
        """The next reply frame ``(type, body)`` (for callers that sent a frame themselves)."""
        return self._receive(None)

    def _receive(self, chunk: bytes | None) -> tuple[int, bytes]:
        try:
            return self.conn.recv_frame(chunk)
        except (ConnectionLost, ProtocolError) as exc:
            raise self._lost(exc) from None
        except KeyboardInterrupt:  # the reply would arrive later and desync the stream
            self.mark_closed()
            raise

    def _recv_raw(self, target: memoryview, describe) -> None:
        bar = self._transfer_bar(target.nbytes, describe)
        try:
            if bar is None:
                self.conn.recv_raw_into(target)
                return
            with bar:
                for start in range(0, target.nbytes, _PROGRESS_CHUNK):
                    part = target[start:start + _PROGRESS_CHUNK]
                    self.conn.recv_raw_into(part)
                    bar.update(part.nbytes)
        except ConnectionLost as exc:
            raise self._lost(exc) from None

    def expect(self, frame: tuple[int, bytes], frame_type: int):
        """The RETURN values or DATA length of a reply frame, or the error that it stands for."""
        got, body = frame
        if got != frame_type:
            self._fail(frame, frame_type)
        if frame_type == P.RETURN:
            return decode_values(body)
        return P.decode_data_header(body)

    def _fail(self, frame: tuple[int, bytes], frame_type: int) -> NoReturn:
        """Raise the error that a reply other than the expected ``frame_type`` stands for."""
        got, body = frame
        if got == P.ERROR:
            raise RemoteError(*P.decode_error(body))
        self.mark_closed()
        if got == P.NOTICE:
            raise P.notice_error(*P.decode_notice(body))
        raise ProtocolError(f"expected {P.FRAME_NAMES[frame_type]}, got {P.FRAME_NAMES[got]}")

    def _lost(self, exc: Exception) -> RPCError:
        self.mark_closed()
        if self.deadline is not None and time.monotonic() >= self.deadline - _TIMEOUT_SLACK:
            return SessionTimeout(f"your {self.timeout:g}s session has expired (connection closed "
                                  f"by the server: {exc})")
        return exc if isinstance(exc, RPCError) else ConnectionLost(str(exc))

    def _transfer_bar(self, nbytes: int, describe):
        """A byte progress bar for a transfer worth one, else None; ``describe()`` names the
        transfer (called only when there is a bar, off the path of small transfers)."""
        if nbytes < self.progress_min_bytes:
            return None
        from ..display import byte_progress, progress_enabled

        return byte_progress(nbytes, describe(), enabled=True) if progress_enabled(self.progress) else None
