"""The client's request/reply channel of one session: framing, error mapping, lifetime, frees.

A :class:`Channel` sends requests (requests.py) and returns their replies: RETURN values, a
CALL's result, or the raw bytes after a DATA frame. A reply that stands for a failure becomes
the error a user can act on (RemoteError with the server's traceback, SessionTimeout,
ServerCrashed, ConnectionLost); once the connection is lost or out of step the channel closes.

Handles dropped by the garbage collector are queued (:meth:`release`) and go out in front of
the next request, in the same write: as one RELEASE without a reply when the server serves it,
else as a FREE whose reply is read first. A finalizer never touches the socket.

A zero-filled tensor the server will accept for certain is allocated the same way
(:meth:`allocate`): an ALLOCATE under an id the client chose, queued in order with the frees.
To know "for certain" the channel's connection counts the bytes of the tensors the session
made, as the server counts them against its ``max_session_bytes``.

The protocol is the channel's :class:`~kernelrpc.wire.connection.ClientConnection`: framing,
the reply decoding and its fast lane, the queue that goes out ahead of a request and the limits'
accounting. The channel is the thin layer of sockets, lock, deadline and progress bars around it.

The user-facing objects (session, tensor, module, function; client.py and remote.py) use only
the public methods here.
"""
from __future__ import annotations

import threading
import time
from typing import NoReturn

from ..errors import ConnectionLost, ProtocolError, RemoteError, RPCError, SessionTimeout
from ..runtime.prefault import prefault
from ..wire import protocol as P
from ..wire.connection import MAX_QUEUED, NOT_ONE_FRAME, ClientConnection
from ..wire.requests import Free, Op, Shutdown
from ..wire.transport import FIRST_READ, PEER_CLOSED, FramedSocket, receive_failed
from ..wire.values import FunctionHandle, TensorHandle

_PROGRESS_CHUNK = 4 << 20
_TIMEOUT_SLACK = 1.0  # a connection lost this close to the session deadline is the timeout


class Channel:
    """Requests and replies over one session's connection. Thread-safe: one request at a time."""

    def __init__(self, sock, info: dict, where: str, initial: bytes = b"", *,
                 progress_min_bytes: int = 16 << 20) -> None:
        self.info = info
        self.address = where
        #: The session connection: framing, replies, the queue ahead of a request, the accounting.
        self.connection = connection = ClientConnection(info)
        self.max_frame_bytes = connection.max_frame_bytes
        self.account = connection.account
        self.conn = FramedSocket(sock, initial=initial, reader=connection)
        self._sendall, self._recv = sock.sendall, sock.recv  # call()'s
        self._result_from_read = connection.result_from_read
        self.timeout = float(info["session_timeout"])
        self.deadline = time.monotonic() + self.timeout if self.timeout else None
        #: Progress bars for large transfers: None = where someone watches, True/False = always/never.
        self.progress: bool | None = None
        self.progress_min_bytes = progress_min_bytes  # transfers at least this large may show a bar
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def serves(self, op: Op) -> bool:
        return self.connection.serves(op)

    # ------------------------------------------------------------ requests

    def request(self, request) -> list:
        """Send ``request`` and return the values of its RETURN reply."""
        return self._exchange(P.encode(request))

    def allocate(self, dtype: str, shape: tuple, device, nbytes: int | None) -> TensorHandle | None:
        """The handle of a new zero-filled tensor whose ALLOCATE goes out with the next request, if
        the server's checks will pass it (its layout checked already, ``nbytes`` its size); else
        None, and the caller sends an ARRAY, whose reply has the server's verdict. Only a genuine
        failure on the device is then heard late (AllocationFailed, from the first use)."""
        with self._lock:
            handle = None if self._closed else self.connection.allocate(dtype, shape, device, nbytes)
            if handle is not None and len(self.connection.queued) >= MAX_QUEUED:  # nothing else to send them with
                self._send(b"")
        return handle

    def global_at(self, name: str) -> FunctionHandle | None:
        """The handle of the global function ``name``, whose GLOBAL_AT goes out with the next
        request, if the server listed ``name`` in its hello (it has it: the lookup cannot fail);
        else None, and the caller sends a GET_GLOBAL, whose reply has the server's verdict."""
        connection = self.connection
        if name not in connection.globals:  # (the connection's own test, without the lock)
            return None
        with self._lock:
            handle = None if self._closed else connection.global_at(name)
            if handle is not None and len(connection.queued) >= MAX_QUEUED:  # nothing else to send them with
                self._send(b"")
        return handle

    def call(self, frame: bytes) -> object:
        """Send a CALL request, ``frame`` (protocol.encode_call, under ``max_frame_bytes``: a remote
        Function encodes it, or sends the one it kept, remote.py); its result as a wire value.

        Fast path (docs/performance.md): the send and the first read of the reply are made here
        (FramedSocket.recv_chunk's read, with its errors), and a reply that arrives whole in that
        read is decoded straight from it (ClientConnection.result_from_read); anything else goes
        the general way (ClientConnection.result_of).
        """
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost on a path that is timed against raw sockets
        try:
            if self.connection.queued or self._closed:
                frame = self._with_frees(frame)
            try:
                self._sendall(frame)
            except OSError as exc:
                raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
            chunk = None
            if not self.connection.pending:
                try:
                    chunk = self._recv(FIRST_READ)
                except OSError as exc:
                    raise self._lost(receive_failed(exc)) from None
                except KeyboardInterrupt:  # the reply would arrive later and desync the stream
                    self.mark_closed()
                    raise
                if not chunk:
                    raise self._lost(ConnectionLost(PEER_CLOSED))
                result = self._result_from_read(chunk)
                if result is not NOT_ONE_FRAME:
                    return result
            reply = self._receive(chunk)
            if reply[0] != P.RETURN:
                self._fail(reply, P.RETURN)
        finally:
            lock.release()
        return self.connection.result_of(reply)

    def _exchange(self, frame: bytes, freeing: int | None = None) -> list:
        """Send an encoded request (that frees the tensor ``freeing``); the values of its RETURN reply."""
        with self._lock:
            if freeing is not None:
                self.account.remove(freeing)
            self._send(frame)
            return self.expect(self._receive(None), P.RETURN)

    def request_with_raw(self, request, view: memoryview, describe, new_tensor: int | None = None) -> list:
        """Send ``request`` followed by the raw bytes of ``view`` (in pieces under a progress bar
        when the transfer is worth one); the values of the RETURN reply. ``new_tensor``: the
        request is an ARRAY of that many bytes, counted once its reply gives the id."""
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
            values = self.expect(self.receive(), P.RETURN)
            if new_tensor is not None and self.connection.allocate_op and len(values) == 1 \
                    and type(values[0]) is int:
                self.account.add(values[0], new_tensor)
            return values

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
            self.connection.queued.append(handle)  # ClientConnection.release, one call less

    def free(self, handle) -> None:
        """Free ``handle`` now."""
        if not self._closed:
            self._exchange(P.encode(Free((handle,))), handle.id)

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
        if self.connection.queued or self._closed:
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
        ahead, answered = self.connection.take_queued()
        if not answered:
            return ahead + frame
        try:  # a server without RELEASE answers the FREE: read that reply before the request's
            self.conn.sock.sendall(ahead)
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
            prefault(target)  # the pieces are prefaulted too, but one call for all is cheaper
            with bar:
                for start in range(0, target.nbytes, _PROGRESS_CHUNK):
                    part = target[start:start + _PROGRESS_CHUNK]
                    self.conn.recv_raw_into(part)
                    bar.update(part.nbytes)
        except ConnectionLost as exc:
            raise self._lost(exc) from None

    def expect(self, frame: tuple[int, bytes], frame_type: int):
        """The RETURN values or DATA length of a reply frame, or the error that it stands for."""
        if frame[0] != frame_type:
            self._fail(frame, frame_type)
        return self.connection.reply_of(frame, frame_type)

    def _fail(self, frame: tuple[int, bytes], frame_type: int) -> NoReturn:
        """Raise the error that a reply other than the expected ``frame_type`` stands for (after
        anything but an ERROR the session is over)."""
        if frame[0] != P.ERROR:
            self.mark_closed()
        raise self.connection.failure(frame, frame_type)  # no local: a traceback cycle would keep its frames

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
