"""Client sessions with a device server: ``connect()`` and the remote Device/Tensor/Module/Function.

The API is synchronous over a plain blocking socket, so it also works when
called from inside a running asyncio event loop (Jupyter). The remote objects
have the same names as the local runtime's, so code runs unchanged locally or
remotely.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, NoReturn

from ..errors import (ConnectionLost, ConnectTimeout, ProtocolError, RemoteError, RPCError,
                      ServerCrashed, SessionTimeout)
from ..netutil import receive_until
from ..runtime.device import Device
from ..runtime.tensor import TensorLayout
from ..runtime.threads import check_num_threads
from . import handshake as H
from .auth import authenticate, resolve_token
from . import protocol as P
from .tls import (TLSConfig, check_plaintext_answer, client_context, describe_failure, is_ssl_error,
                  is_tls_socket, refused_after_handshake, wrap_client)
from .transport import FramedSocket
from .values import (DeviceValue, FunctionHandle, ModuleHandle, TensorHandle, TensorValue,
                     decode_values, nbytes_of)

if TYPE_CHECKING:
    import ssl

_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
#: Transfers at least this large show a progress bar (where bars are shown: display.progress).
PROGRESS_MIN_BYTES = 16 << 20
_PROGRESS_CHUNK = 4 << 20
_TIMEOUT_SLACK = 1.0  # a connection lost this close to the session deadline is the timeout


def connect(host: str, port: int, key: str = "", session_timeout: float = 0, *,
            connect_timeout: float | None = 60.0, auth_token: bytes | str | None = None,
            tls: TLSConfig | ssl.SSLContext | None = None,
            handshake_timeout: float | None = None) -> "RPCSession":
    """Open a session with the device server at ``host:port``.

    ``key`` is the server's key; ``session_timeout`` (seconds, 0 = none) asks the server to end the
    session after that long. ``connect_timeout`` bounds the TCP connect, and (unless
    ``handshake_timeout`` is given) the TLS and RPC handshakes and the version exchange (a
    server busy with another session makes the handshake wait).
    ``auth_token`` (default: ``$KERNELRPC_AUTH_TOKEN``, or the file ``$KERNELRPC_AUTH_TOKEN_FILE``
    names) is the shared secret of a server started with ``--auth-token-file``; with a token,
    a server that does not prove it knows the same token is refused.
    ``tls`` (a :class:`~kernelrpc.rpc.tls.TLSConfig` or an ``ssl.SSLContext``; default: from
    ``$KERNELRPC_TLS_CA``/``_CERT``/``_KEY``, else plain TCP) connects over TLS, checking the
    server's certificate against ``host``.
    """
    token = resolve_token(auth_token)
    ctx = client_context(tls)
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
    except socket.timeout:
        raise ConnectTimeout(f"connecting to {where} took more than {connect_timeout:g} s") from None
    except OSError as exc:
        raise ConnectionLost(f"cannot connect to kernelrpc server at {where}: {exc}") from exc
    try:
        if handshake_timeout is not None:
            sock.settimeout(handshake_timeout)
        if ctx is not None:
            try:
                sock = wrap_client(sock, ctx, host, where)
            except socket.timeout:
                raise ConnectTimeout(f"{where} did not complete the TLS handshake in time (does it "
                                     "speak TLS?)") from None
        return open_session(sock, H.make_key("client", key, session_timeout or None),
                            where, session_timeout, auth_token=token)
    except BaseException:
        sock.close()
        raise


def open_session(sock: socket.socket, handshake_key: str, where: str,
                 session_timeout: float = 0, auth_token: bytes | None = None) -> "RPCSession":
    """Run the handshake and the version exchange on a connected socket (direct, tracker or proxy),
    plain or TLS (an ``ssl.SSLSocket`` whose TLS handshake is done).

    With ``auth_token`` (checked bytes, see ``auth.resolve_token``), the challenge-response runs
    between the handshake key and the server's reply.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    over_tls = is_tls_socket(sock)
    try:
        sock.sendall(H.encode_preamble(handshake_key))
        if not over_tls:
            check_plaintext_answer(sock, where)
        after_auth = b""
        if auth_token is not None:
            after_auth = authenticate(sock, auth_token, handshake_key.encode(), where)
        reply = _read_until(sock, H.ReplyParser(), where, "handshake", after_auth)
        reply.raise_for_code(where)
        sock.sendall(P.encode_hello())
        hello_parser = P.HelloReplyParser()
        hello = _read_until(sock, hello_parser, where, "version exchange")
    except socket.timeout:
        raise ConnectTimeout(f"{where} did not complete the handshake in time (is it busy with "
                             "another session, or not a kernelrpc server?)") from None
    except (OSError, ConnectionLost) as exc:
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        if over_tls and is_ssl_error(cause):   # mutual TLS refusals arrive on the first read
            raise describe_failure(cause, where) from None
        if over_tls and isinstance(cause, ConnectionResetError):
            raise refused_after_handshake(where) from None
        raise
    sock.settimeout(None)
    return RPCSession(sock, hello.info, where, hello_parser.unused)


def _read_until(sock: socket.socket, parser, where: str, stage: str, initial: bytes = b""):
    return receive_until(sock, parser, where, f"the {stage}", initial,
                         closed_hint=" (wrong key for a proxy, or a server that speaks another protocol)")


class RPCSession:
    """A session with one device server. Use as a context manager, or call :meth:`close`."""

    def __init__(self, sock: socket.socket, info: dict, where: str, initial: bytes = b"") -> None:
        self.info = info
        self.address = where
        self._max_frame_bytes = int(info["max_frame_bytes"])
        self._conn = FramedSocket(sock, self._max_frame_bytes, initial)
        self._lock = threading.Lock()
        self._closed = False
        self._to_free: list = []
        timeout = float(info["session_timeout"])
        self._deadline = time.monotonic() + timeout if timeout else None
        self._timeout = timeout
        #: Progress bars for large transfers and tensor copies: None = where someone watches
        #: (a notebook or a terminal), True/False = always/never.
        self.progress: bool | None = None

    def __repr__(self) -> str:
        if self._closed:
            return f"<RPCSession {self.address} closed>"
        detail = [f"{self.info.get('server', '?')} pid {self.info.get('pid', '?')}"]
        if self._deadline is not None:
            detail.append(f"{max(self._deadline - time.monotonic(), 0):.0f} s of "
                          f"{self._timeout:g} s left")
        return f"<RPCSession {self.address} ({', '.join(detail)})>"

    def _transfer_bar(self, nbytes: int, describe):
        """A byte progress bar for a transfer worth one, else None; ``describe()`` names the
        transfer (called only when there is a bar, off the path of small transfers)."""
        if nbytes < PROGRESS_MIN_BYTES:
            return None
        from ..display import byte_progress, progress_enabled

        return byte_progress(nbytes, describe(), enabled=True) if progress_enabled(self.progress) else None

    def __enter__(self) -> "RPCSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ requests

    def _request(self, op: int, args=(), raw=None) -> list:
        """Send a request (and a raw stream after it) and return the RETURN values."""
        return decode_values(self._exchange(P.encode_request(op, args), raw))

    def _call(self, function_id: int, args):
        """Call a remote function; its result as a wire value."""
        request = P.encode_scalar_call(function_id, args)
        if request is None:
            request = P.encode_call(function_id, self._args_to_wire(args))
            if len(request) > self._max_frame_bytes:
                raise ValueError(f"the arguments of this call take {len(request)} bytes, more than the "
                                 f"server's frame limit of {self._max_frame_bytes} bytes; pass large "
                                 "arrays as remote tensors (sess.empty(...).copyfrom(array))")
        conn = self._conn
        lock = self._lock
        lock.acquire()
        try:
            if not self._to_free and not self._closed:
                try:
                    conn.sock.sendall(request)
                except OSError as exc:
                    raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
            else:
                self._send(request, None)
            try:
                chunk = conn.recv_chunk()
            except ConnectionLost as exc:
                raise self._lost(exc) from None
            except KeyboardInterrupt:  # the reply would arrive later and desync the stream
                self._mark_closed()
                raise
            if chunk is not None:
                result = P.decode_result_frame(chunk, self._max_frame_bytes)
                if result is not P.NOT_ONE_FRAME:
                    return result
                conn.reader.feed(chunk)
            frame = self._receive()
            if frame[0] != P.RETURN:
                self._fail(frame, P.RETURN)
        finally:
            lock.release()
        return P.decode_result(frame[1])

    def _exchange(self, request: bytes, raw=None) -> bytes:
        """Send an encoded request (and a raw stream after it); the body of the RETURN reply."""
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost on a path that is timed against raw sockets
        try:
            if raw is None and not self._to_free and not self._closed:  # the common case, kept short
                try:
                    self._conn.sock.sendall(request)
                except OSError as exc:
                    raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
            else:
                self._send(request, raw)
            frame = self._receive()
            if frame[0] != P.RETURN:
                self._fail(frame, P.RETURN)
        finally:
            lock.release()
        return frame[1]

    def _send(self, request: bytes, raw) -> None:
        if self._closed:
            raise ConnectionLost(f"the session with {self.address} is closed")
        freed = self._to_free
        if freed:
            self._to_free = []
            request = P.encode_request(P.FREE, freed) + request
        try:
            if raw is None:
                self._conn.send(request)
            else:
                self._conn.send_with_raw(request, raw)
        except ConnectionLost as exc:
            raise self._lost(exc) from None
        if freed:
            try:
                self._expect(self._receive(), P.RETURN)
            except RemoteError:  # the request's own reply would be read as this one's
                self._mark_closed()
                raise

    def _receive(self) -> tuple[int, bytes]:
        """The next reply frame."""
        try:
            return self._conn.recv_frame()
        except (ConnectionLost, ProtocolError) as exc:
            raise self._lost(exc) from None
        except KeyboardInterrupt:  # the reply would arrive later and desync the stream
            self._mark_closed()
            raise

    def _expect(self, frame: tuple[int, bytes], frame_type: int):
        """The RETURN values or DATA length of a reply, or the error that the reply stands for."""
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
        if got == P.NOTICE:
            self._mark_closed()
            kind, message, sig, exit_code = P.decode_notice(body)
            if kind == P.NOTICE_TIMEOUT:
                raise SessionTimeout(message)
            if kind == P.NOTICE_CRASHED:
                raise ServerCrashed(message, signal=sig, exit_code=exit_code)
            raise ConnectionLost(f"the server ended the session: {kind}: {message}")
        self._mark_closed()
        raise ProtocolError(f"expected {P.FRAME_NAMES[frame_type]}, got {P.FRAME_NAMES[got]}")

    def _lost(self, exc: Exception) -> RPCError:
        self._mark_closed()
        if self._deadline is not None and time.monotonic() >= self._deadline - _TIMEOUT_SLACK:
            return SessionTimeout(f"your {self._timeout:g}s session has expired (connection closed "
                                  f"by the server: {exc})")
        return exc if isinstance(exc, RPCError) else ConnectionLost(str(exc))

    def _mark_closed(self) -> None:
        self._closed = True
        try:
            self._conn.sock.close()
        except OSError:
            pass

    def _free_later(self, handle) -> None:
        """Called from finalizers: queue the free, sent with the next request (never mid-request)."""
        if not self._closed:
            self._to_free.append(handle)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End the session; the server removes its workspace."""
        with self._lock:
            if self._closed:
                return
            try:
                self._conn.send(P.encode_request(P.SHUTDOWN))
            except ConnectionLost:
                pass
            self._mark_closed()

    # ------------------------------------------------------------ values

    def _args_to_wire(self, args):
        for arg in args:
            if type(arg) not in _PLAIN:
                return [self._to_wire(a) for a in args]
        return args

    def _to_wire(self, value):
        if type(value) in _PLAIN:
            return value
        if isinstance(value, (Tensor, Module, Function)):
            if value._session is not self:
                raise ValueError(f"{value!r} belongs to another session")
            return value._handle
        if isinstance(value, Device):
            return DeviceValue(value.device_type, value.device_id)
        if isinstance(value, (list, tuple)):
            return [self._to_wire(v) for v in value]
        if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray":
            return value.item()  # numpy scalars travel as Python scalars, not 0-d tensors
        if hasattr(value, "__array_interface__") or type(value).__name__ == "Tensor":
            return _inline_tensor(value)
        return value

    def _from_wire(self, value):
        if type(value) in _PLAIN:
            return value
        if isinstance(value, TensorHandle):
            return Tensor(self, value)
        if isinstance(value, ModuleHandle):
            return Module(self, value, None)
        if isinstance(value, FunctionHandle):
            return Function(self, value, "<remote function>")
        if isinstance(value, DeviceValue):
            return Device(value.device_type, value.device_id, session=self)
        if isinstance(value, list):
            return [self._from_wire(v) for v in value]
        return value

    # ------------------------------------------------------------ public API

    def cpu(self, dev_id: int = 0) -> Device:
        return Device("cpu", dev_id, session=self)

    def device(self, dev_type="cpu", dev_id: int = 0) -> Device:
        return Device(dev_type, dev_id, session=self)

    def get_function(self, name: str) -> "Function":
        """A global function registered on the server, e.g. ``"testing.echo"``."""
        (handle,) = self._request(P.GET_GLOBAL, [name])
        return Function(self, handle, name)

    def list_global_func_names(self) -> list[str]:
        (names,) = self._request(P.LIST_GLOBALS)
        return names

    def device_info(self) -> dict:
        """What the device is: architecture, CPU model and features, the target to build for it."""
        return json.loads(self.get_function("runtime.device_info")())

    def target(self) -> str:
        """The target string to build kernels for this device, e.g.
        ``"llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72 -mattr=+neon,+crc"``."""
        return self.device_info()["target"]

    def upload(self, data, target: str | None = None) -> None:
        """Upload bytes, or the file at a host path, to ``target`` in the session's workspace."""
        if isinstance(data, (str, os.PathLike)):
            path = os.fspath(data)
            target = target or os.path.basename(path)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._check_upload(size)
                bar = self._transfer_bar(size, lambda: f"upload {target}")
                with self._lock:
                    self._send(P.encode_request(P.UPLOAD, [target, size]), b"")
                    try:
                        if bar is None:
                            if size:
                                self._conn.sock.sendfile(f, 0, size)
                        else:
                            with bar:
                                sent = 0
                                while sent < size:
                                    n = self._conn.sock.sendfile(
                                        f, sent, min(_PROGRESS_CHUNK, size - sent))
                                    if not n:
                                        raise OSError(f"{path} shrank while it was being sent")
                                    sent += n
                                    bar.update(n)
                    except OSError as exc:
                        raise self._lost(exc) from None
                    self._expect(self._receive(), P.RETURN)
            return
        if target is None:
            raise ValueError("upload of bytes needs a target name")
        view = memoryview(data).cast("B")
        self._check_upload(view.nbytes)
        self._request_with_raw(P.UPLOAD, [target, view.nbytes], view, lambda: f"upload {target}")

    def _request_with_raw(self, op: int, args: list, view: memoryview, describe) -> None:
        """A request followed by the raw bytes of ``view``, in pieces under a progress bar when
        the transfer is worth one."""
        bar = self._transfer_bar(view.nbytes, describe)
        if bar is None:
            self._request(op, args, view)
            return
        with self._lock, bar:
            self._send(P.encode_request(op, args), b"")
            for start in range(0, view.nbytes, _PROGRESS_CHUNK):
                part = view[start:start + _PROGRESS_CHUNK]
                try:
                    self._conn.sock.sendall(part)
                except OSError as exc:
                    raise self._lost(ConnectionLost(f"connection lost while sending: {exc}")) from None
                bar.update(part.nbytes)
            self._expect(self._receive(), P.RETURN)

    def _check_upload(self, size: int) -> None:
        limit = self.info["max_upload_bytes"]
        if size > limit:
            raise ValueError(f"upload of {size} bytes exceeds the server's limit of {limit} bytes "
                             "(--max-upload-bytes)")

    def download(self, name: str) -> bytearray:
        """The contents of a file in the session's workspace (received in place, no extra copy)."""
        with self._lock:
            self._send(P.encode_request(P.DOWNLOAD, [name]), None)
            nbytes = self._expect(self._receive(), P.DATA)
            if nbytes > max(self.info["max_upload_bytes"], self.info["max_tensor_bytes"]):
                self._mark_closed()
                raise ProtocolError(f"the server announces a {nbytes}-byte download, beyond its own "
                                    "limits; refusing to allocate it")
            out = bytearray(nbytes)
            self._recv_raw(memoryview(out), lambda: f"download {name}")
        return out

    def _recv_raw(self, target: memoryview, describe) -> None:
        """Fill ``target`` with the raw bytes that follow a DATA frame, in pieces under a
        progress bar when the transfer is worth one."""
        bar = self._transfer_bar(target.nbytes, describe)
        try:
            if bar is None:
                self._conn.recv_raw_into(target)
                return
            with bar:
                for start in range(0, target.nbytes, _PROGRESS_CHUNK):
                    part = target[start:start + _PROGRESS_CHUNK]
                    self._conn.recv_raw_into(part)
                    bar.update(part.nbytes)
        except ConnectionLost as exc:
            raise self._lost(exc) from None

    def remove(self, name: str) -> None:
        self._request(P.REMOVE, [name])

    def listdir(self, path: str = "") -> list[str]:
        (names,) = self._request(P.LISTDIR, [path])
        return names

    def load_module(self, name: str) -> "Module":
        """Load a module uploaded to the workspace (``upload(path)`` first)."""
        handle, metadata = self._request(P.LOAD_MODULE, [name])
        return Module(self, handle, json.loads(metadata))

    def empty(self, shape, dtype="float32", dev: Device | None = None) -> "Tensor":
        """Allocate a zero-filled tensor on the remote device."""
        dev = dev or self.cpu(0)
        if isinstance(shape, int):
            shape = (shape,)
        dtype = getattr(dtype, "name", None) or str(dtype)
        (handle,) = self._request(P.EMPTY, [list(shape), dtype, DeviceValue(dev.device_type, dev.device_id)])
        return Tensor(self, handle)

    def array(self, source, dev: Device | None = None) -> "Tensor":
        """A remote tensor holding a copy of ``source`` (an ndarray or anything numpy accepts)."""
        import numpy as np

        array = np.ascontiguousarray(source)
        tensor = self.empty(array.shape, array.dtype.name, dev)
        tensor.copyfrom(array)
        return tensor


def _inline_tensor(value) -> TensorValue:
    """A local array or runtime Tensor sent by value as a call argument."""
    if type(value).__name__ == "Tensor" and hasattr(value, "buffer"):
        return TensorValue(value.dtype, tuple(value.shape), DeviceValue("cpu", 0), bytes(value.buffer))
    import numpy as np

    array = np.ascontiguousarray(value)
    return TensorValue(array.dtype.name, tuple(array.shape), DeviceValue("cpu", 0), array.tobytes())


def _byte_view(array) -> memoryview:
    """A flat byte view of a C-contiguous ndarray (also for zero-sized arrays, which cast refuses)."""
    import numpy as np

    return memoryview(array.reshape(-1).view(np.uint8))


class _Remote:
    __slots__ = ("_session", "_handle", "__weakref__")

    def __del__(self) -> None:
        session = getattr(self, "_session", None)
        if session is not None:
            session._free_later(self._handle)


class Function(_Remote):
    """A function on the server (a module's kernel or a global function); call it like one."""

    __slots__ = ("name", "_id")

    def __init__(self, session: RPCSession, handle: FunctionHandle, name: str) -> None:
        self._session = session
        self._handle = handle
        self._id = handle.id
        self.name = name

    def __call__(self, *args):
        session = self._session
        result = session._call(self._id, args)
        return result if type(result) in _PLAIN else session._from_wire(result)

    def __repr__(self) -> str:
        return f"<remote Function {self.name} on {self._session.address}>"


class TimeEvaluator(Function):
    """The callable ``Module.time_evaluator`` returns: each call runs the timing on the device."""

    __slots__ = ()

    def __call__(self, *args):
        from ..runtime import ProfileResult

        return ProfileResult.from_dict(json.loads(super().__call__(*args)))


class Module(_Remote):
    """A module loaded on the server."""

    __slots__ = ("metadata",)

    def __init__(self, session: RPCSession, handle: ModuleHandle, metadata: dict | None) -> None:
        self._session = session
        self._handle = handle
        self.metadata = metadata

    @property
    def entry_name(self) -> str | None:
        return (self.metadata or {}).get("entry")

    def get_function(self, name: str) -> Function:
        (handle,) = self._session._request(P.GET_FUNCTION, [self._handle, name])
        return Function(self._session, handle, name)

    def __getitem__(self, name: str) -> Function:
        return self.get_function(name)

    def time_evaluator(self, name: str, dev: Device, number: int = 10, repeat: int = 1,
                       min_repeat_ms: float = 0, cooldown_interval_ms: float = 0,
                       repeats_to_cooldown: int = 1, f_preproc: str = "", *,
                       limit_zero_time_iterations: int = 100, cache_flush_bytes: int = 0) -> TimeEvaluator:
        """A callable that times ``name`` on the device (TVM semantics); returns a ProfileResult."""
        args = [self._handle, name, DeviceValue(dev.device_type, dev.device_id), int(number),
                int(repeat), float(min_repeat_ms), float(cooldown_interval_ms), int(repeats_to_cooldown),
                f_preproc, int(limit_zero_time_iterations), int(cache_flush_bytes)]
        (handle,) = self._session._request(P.TIME_EVALUATOR, args)
        return TimeEvaluator(self._session, handle, name)

    @property
    def target(self) -> dict:
        return (self.metadata or {}).get("target", {})

    @property
    def function_names(self) -> list[str]:
        return [f["name"] for f in (self.metadata or {}).get("functions", [])]

    @property
    def entry_func(self) -> Function:
        if self.entry_name is None:
            raise AttributeError("the module has no entry function")
        return self.get_function(self.entry_name)

    def implements_function(self, name: str) -> bool:
        return name in self.function_names

    __contains__ = implements_function

    def set_num_threads(self, n: int) -> int:
        """Threads for this module's parallel loops on the device (0 = all usable cores there);
        returns the number its pool now has. Checked here as the local module checks it."""
        n = check_num_threads(n)
        return self._session.get_function("runtime.module_set_num_threads")(self, n)

    def __repr__(self) -> str:
        target = self.target.get("string", "")
        return (f"<remote Module [{', '.join(self.function_names)}]"
                f"{' for ' + target if target else ''} on {self._session.address}>")


class Tensor(_Remote, TensorLayout):
    """A tensor in the device's memory. ``numpy()`` and ``copyfrom()`` stream its bytes."""

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, session: RPCSession, handle: TensorHandle) -> None:
        self._session = session
        self._handle = handle
        self.shape = tuple(handle.shape)
        self.dtype = handle.dtype
        self.device = Device(handle.device.device_type, handle.device.device_id, session=session)

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.dtype, self.shape)

    def _live(self) -> RPCSession:
        if self._session is None:
            raise ValueError("the tensor has been freed")
        return self._session

    @property
    def freed(self) -> bool:
        return self._session is None

    def free(self) -> None:
        """Release the device memory now (otherwise it goes when this object is collected)."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            session._request(P.FREE, [self._handle])

    def copyfrom(self, source) -> "Tensor":
        """Fill from an ndarray (same shape; converted to this dtype), a local Tensor or a buffer."""
        if hasattr(source, "__array_interface__") or isinstance(source, (list, tuple)):
            view = _byte_view(self._contiguous_array(source))
        elif hasattr(source, "buffer") and hasattr(source, "shape"):
            self._check_same_layout(source)
            view = source.buffer
        else:
            view = memoryview(source).cast("B")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyfrom: source has {view.nbytes} bytes, the tensor {self.nbytes}")
        self._live()._request_with_raw(P.COPY_TO, [self._handle, 0, view.nbytes], view,
                                       lambda: f"copy to {self.dtype}{list(self.shape)}")
        return self

    def copyto_buffer(self, target) -> None:
        """Stream the tensor's bytes into a writable buffer of exactly ``nbytes``."""
        view = target if isinstance(target, memoryview) and target.format == "B" else \
            memoryview(target).cast("B")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyto: target has {view.nbytes} bytes, the tensor {self.nbytes}")
        session = self._live()
        with session._lock:
            session._send(P.encode_request(P.COPY_FROM, [self._handle, 0, view.nbytes]), None)
            nbytes = session._expect(session._receive(), P.DATA)
            if nbytes != view.nbytes:
                session._mark_closed()
                raise ProtocolError(f"server sent {nbytes} bytes for a {view.nbytes}-byte tensor")
            session._recv_raw(view, lambda: f"copy from {self.dtype}{list(self.shape)}")

    def numpy(self):
        import numpy as np

        array = np.empty(self.shape, dtype=self.dtype)
        self.copyto_buffer(_byte_view(array))
        return array

    def copyto(self, target):
        """Copy into a local runtime Tensor or ndarray of the same layout, or onto a Device."""
        if isinstance(target, Device):
            if target.session is None:
                from ..runtime import Tensor as LocalTensor

                local = LocalTensor(self.shape, self.dtype, target)
                self.copyto_buffer(local.buffer)
                return local
            return target.session.empty(self.shape, self.dtype, target).copyfrom(self.numpy())
        if hasattr(target, "buffer"):
            self.copyto_buffer(target.buffer)
        else:
            self.copyto_buffer(target)
        return target

    def __repr__(self) -> str:
        where = "freed" if self._session is None else f"on {self._session.address}"
        return f"<remote Tensor {self.dtype}{list(self.shape)} {where}>"


__all__ = ["RPCSession", "connect", "open_session", "Tensor", "Module", "Function", "TimeEvaluator"]
