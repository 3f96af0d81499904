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
To know "for certain" the channel counts the bytes of the tensors the session made, as the
server counts them against its ``max_session_bytes``.

The user-facing objects (session, tensor, module, function; client.py and remote.py) use only
the public methods here.
"""
from __future__ import annotations

import threading
import time
from typing import NoReturn

from ..errors import AllocationFailed, ConnectionLost, ProtocolError, RemoteError, RPCError, SessionTimeout
from ..runtime.prefault import prefault
from ..wire import protocol as P
from ..wire.protocol import NOT_ONE_FRAME, decode_result, decode_result_frame
from ..wire.requests import CLIENT_IDS_FIRST, CLIENT_IDS_LAST, OPTIONAL_OPS, Free, GlobalAt, Op, Shutdown
from ..wire.transport import FIRST_READ, PEER_CLOSED, FramedSocket, receive_failed
from ..wire.values import FunctionHandle, TensorHandle, decode_values

_PROGRESS_CHUNK = 4 << 20
_TIMEOUT_SLACK = 1.0  # a connection lost this close to the session deadline is the timeout
_MAX_OPS_LISTED = 256
_MAX_QUEUED = 256   # frees and ALLOCATEs held for the next request at most
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
        self._sendall, self._recv, self._reader = sock.sendall, sock.recv, self.conn.reader  # call()'s
        self.timeout = float(info["session_timeout"])
        self.deadline = time.monotonic() + self.timeout if self.timeout else None
        #: Progress bars for large transfers: None = where someone watches, True/False = always/never.
        self.progress: bool | None = None
        self.progress_min_bytes = progress_min_bytes  # transfers at least this large may show a bar
        self._lock = threading.Lock()
        self._closed = False
        self._released: list = []       # handles to free, and ALLOCATE and GLOBAL_AT frames, in the order they came
        self._seen = 0                  # how far allocate() has read _released
        #: Pipelined allocations: only with a server that announces its limits for them.
        self._allocate_op = (Op.ALLOCATE in self.ops and self._release_op and info["max_session_bytes"] > 0
                             and info["max_client_tensors"] > 0)
        self.tensor_bytes = 0           # of the live tensors ARRAY and ALLOCATE made, as the server counts
        self.client_tensors = 0         # of those, the ones under ids this client chose
        self._sizes: dict = {}          # their ids -> bytes (0 for a function under a client's id)
        self._next_client_id = CLIENT_IDS_FIRST
        #: Pipelined get_function (GLOBAL_AT): the names the server listed, with a server that has it.
        self._globals = (frozenset(info["globals"]) if Op.GLOBAL_AT in self.ops and self._release_op
                         and info["max_client_tensors"] > 0 else frozenset())

    @property
    def closed(self) -> bool:
        return self._closed

    def serves(self, op: Op) -> bool:
        return op not in OPTIONAL_OPS or op in self.ops

    # ------------------------------------------------------------ requests

    def request(self, request) -> list:
        """Send ``request`` and return the values of its RETURN reply."""
        return decode_values(self._exchange(P.encode(request)))

    def allocate(self, dtype: str, shape: tuple, device, nbytes: int | None) -> TensorHandle | None:
        """The handle of a new zero-filled tensor whose ALLOCATE goes out with the next request, if
        the server's checks will pass it (its layout checked already, ``nbytes`` its size); else
        None, and the caller sends an ARRAY, whose reply has the server's verdict. Only a genuine
        failure on the device is then heard late (AllocationFailed, from the first use)."""
        if not self._allocate_op or nbytes is None or device.device_type != "cpu":
            return None
        with self._lock:
            handle_id = self._client_id(nbytes)
            if handle_id is None:
                return None
            handle = TensorHandle(handle_id, dtype, shape, device)
            self._queue(P.encode_request(P.ALLOCATE, [handle]))
        return handle

    def global_at(self, name: str) -> FunctionHandle | None:
        """The handle of the global function ``name``, whose GLOBAL_AT goes out with the next
        request, if the server listed ``name`` in its hello (it has it: the lookup cannot fail);
        else None, and the caller sends a GET_GLOBAL, whose reply has the server's verdict."""
        if name not in self._globals:
            return None
        with self._lock:
            handle_id = self._client_id(0)
            if handle_id is None:
                return None
            handle = FunctionHandle(handle_id)
            self._queue(P.encode(GlobalAt(name, handle)))
        return handle

    def _client_id(self, nbytes: int) -> int | None:
        """A new id of this client's for an entry of ``nbytes`` (0: a function), counted as the
        server will count it, or None if the server would refuse it. Under the lock."""
        released, sizes = self._released, self._sizes
        for queued in released[self._seen:]:   # freed already, as the server will see it first
            if type(queued) is not bytes and queued.id in sizes:
                self._uncount(queued.id)
        handle_id = self._next_client_id
        if (self._closed or nbytes > self.info["max_tensor_bytes"] or handle_id > CLIENT_IDS_LAST
                or self.tensor_bytes + nbytes > self.info["max_session_bytes"]
                or self.client_tensors >= self.info["max_client_tensors"]):
            return None
        self._next_client_id = handle_id + 1
        self.client_tensors += 1
        self._count(handle_id, nbytes)
        return handle_id

    def _queue(self, frame: bytes) -> None:
        """Send ``frame`` (no reply) with the next request, in order with the queued frees."""
        released = self._released
        released.append(frame)
        self._seen = len(released)
        if len(released) >= _MAX_QUEUED:  # nothing else to send them with: send them now
            self._send(b"")

    def call(self, frame: bytes) -> object:
        """Send a CALL request, ``frame`` (protocol.encode_call, under ``max_frame_bytes``: a remote
        Function encodes it, or sends the one it kept, remote.py); its result as a wire value.

        Fast path (docs/performance.md): the send and the first read of the reply are made here
        (FramedSocket.recv_chunk's read, with its errors), and a reply that arrives whole in that
        read is decoded straight from it (protocol.decode_result_frame); anything else goes the
        general way.
        """
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost on a path that is timed against raw sockets
        try:
            if self._released or self._closed:
                frame = self._with_frees(frame)
            try:
                self._sendall(frame)
            except OSError as exc:
                raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
            chunk = None
            if not self._reader.pending:
                try:
                    chunk = self._recv(FIRST_READ)
                except OSError as exc:
                    raise self._lost(receive_failed(exc)) from None
                except KeyboardInterrupt:  # the reply would arrive later and desync the stream
                    self.mark_closed()
                    raise
                if not chunk:
                    raise self._lost(ConnectionLost(PEER_CLOSED))
                result = decode_result_frame(chunk, self.max_frame_bytes)
                if result is not NOT_ONE_FRAME:
                    return result
            reply = self._receive(chunk)
            if reply[0] != _RETURN:
                self._fail(reply, _RETURN)
        finally:
            lock.release()
        return decode_result(reply[1])

    def _exchange(self, frame: bytes, freeing: int | None = None) -> bytes:
        """Send an encoded request (that frees the tensor ``freeing``); the body of its RETURN reply."""
        with self._lock:
            if freeing is not None:
                self._uncount(freeing)
            self._send(frame)
            reply = self._receive(None)
            if reply[0] != _RETURN:
                self._fail(reply, _RETURN)
        return reply[1]

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
            if new_tensor is not None and self._allocate_op and len(values) == 1 and type(values[0]) is int:
                self._count(values[0], new_tensor)
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
            self._released.append(handle)

    def free(self, handle) -> None:
        """Free ``handle`` now."""
        if not self._closed:
            self._exchange(P.encode(Free((handle,))), handle.id)

    def _count(self, handle_id: int, nbytes: int) -> None:
        self._sizes[handle_id] = nbytes
        self.tensor_bytes += nbytes

    def _uncount(self, handle_id: int) -> None:
        nbytes = self._sizes.pop(handle_id, None)
        if nbytes is not None:
            self.tensor_bytes -= nbytes
            if handle_id >= CLIENT_IDS_FIRST:
                self.client_tensors -= 1

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
        self._seen = 0
        if self._release_op:
            if not self._allocate_op and not self._globals:   # handles only: no frame queued
                return P.encode_request(P.RELEASE, [h.id for h in released]) + frame  # Release's wire values
            return self._in_order(released) + frame
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

    def _in_order(self, released: list) -> bytes:
        """The queued frees (as RELEASEs), ALLOCATEs and GLOBAL_ATs in the order they came, the freed
        entries under this client's ids uncounted."""
        sizes, parts, ids = self._sizes, [], []
        for queued in released:
            if type(queued) is bytes:
                if ids:
                    parts.append(P.encode_request(P.RELEASE, ids))
                    ids = []
                parts.append(queued)
            else:
                handle_id = queued.id
                ids.append(handle_id)
                if handle_id in sizes:
                    self._uncount(handle_id)
        if ids:
            if not parts:
                return P.encode_request(P.RELEASE, ids)
            parts.append(P.encode_request(P.RELEASE, ids))
        return b"".join(parts)

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
            type_name, message, traceback_text = P.decode_error(body)
            kind = AllocationFailed if type_name == "AllocationFailed" else RemoteError
            raise kind(type_name, message, traceback_text)
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
