"""Client sessions with a device server: ``connect()``, ``open_session()`` and :class:`RPCSession`.

The API is synchronous over a plain blocking socket, so it also works when
called from inside a running asyncio event loop (Jupyter). The session is the
user-facing side; the request/reply machinery is its :class:`~.channel.Channel`,
and the remote objects it hands out (remote.py) have the same names as the local
runtime's, so code runs unchanged locally or remotely.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import TYPE_CHECKING

from ..errors import ConnectionLost, ConnectTimeout, ProtocolError
from ..netutil import receive_until
from ..runtime.device import Device
from ..wire import handshake as H
from ..wire.hello import HelloReplyParser, encode_hello
from ..wire.auth import authenticate, resolve_token
from ..wire.convert import PLAIN, Converter, tensor_value
from ..wire.tls import (TLSConfig, check_plaintext_answer, client_context, describe_failure, is_ssl_error,
                        is_tls_socket, refused_after_handshake, wrap_client)
from ..wire.requests import (Array, Download, Empty, GetGlobal, ListDir, ListGlobals, LoadModule, Op, Remove,
                             Upload)
from ..wire.values import DeviceValue, FunctionHandle, ModuleHandle, TensorHandle, nbytes_of
from .channel import Channel
from .remote import Function, Module, Tensor, TimeEvaluator, byte_view

if TYPE_CHECKING:
    import ssl

_DTYPE_NAMES: dict = {}  # numpy dtype -> name: numpy's ``dtype.name`` costs ~2 us a time
_NO_BYTES = memoryview(b"")


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def _layout_bytes(dtype: str, shape: tuple) -> int | None:
    """The size of a tensor of this layout, or None when the server would refuse the layout."""
    try:
        return nbytes_of(dtype, shape)
    except ProtocolError:
        return None


#: Transfers at least this large show a progress bar (where bars are shown: display.progress).
PROGRESS_MIN_BYTES = 16 << 20


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
    ``tls`` (a :class:`~kernelrpc.wire.tls.TLSConfig` or an ``ssl.SSLContext``; default: from
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
        sock.sendall(encode_hello())
        hello_parser = HelloReplyParser()
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


class RPCSession(Converter):
    """A session with one device server. Use as a context manager, or call :meth:`close`.

    ``channel`` carries the requests; the session turns the user's calls into them and the
    replies into remote objects (and converts values both ways, as a Converter).
    """

    def __init__(self, sock: socket.socket, info: dict, where: str, initial: bytes = b"") -> None:
        self.channel = Channel(sock, info, where, initial, progress_min_bytes=PROGRESS_MIN_BYTES)
        self._array_op = self.channel.serves(Op.ARRAY)
        self.info = info
        self.address = where

    @property
    def progress(self) -> bool | None:
        """Progress bars for large transfers and tensor copies: None = where someone watches
        (a notebook or a terminal), True/False = always/never."""
        return self.channel.progress

    @progress.setter
    def progress(self, value: bool | None) -> None:
        self.channel.progress = value

    @property
    def closed(self) -> bool:
        return self.channel.closed

    def close(self) -> None:
        """End the session; the server removes its workspace."""
        self.channel.close()

    def __enter__(self) -> "RPCSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"<RPCSession {self.address} closed>"
        detail = [f"{self.info.get('server', '?')} pid {self.info.get('pid', '?')}"]
        deadline = self.channel.deadline
        if deadline is not None:
            detail.append(f"{max(deadline - time.monotonic(), 0):.0f} s of "
                          f"{self.channel.timeout:g} s left")
        return f"<RPCSession {self.address} ({', '.join(detail)})>"

    # ------------------------------------------------------------ values (Converter)

    def to_wire(self, value):
        if type(value) is Tensor and value._session is self:  # a kernel call's arguments
            return value._handle
        return Converter.to_wire(self, value)

    def all_to_wire(self, values) -> list:
        """A call's arguments as wire values: this session's remote tensors (their handles) and
        plain values in one pass, anything else by ``to_wire``, which raises the same errors."""
        plain, to_wire = PLAIN, self.to_wire
        out = []
        for value in values:
            kind = type(value)
            if kind is Tensor and value._session is self:
                out.append(value._handle)
            else:
                out.append(value if kind in plain else to_wire(value))
        return out

    def object_to_wire(self, value):
        if isinstance(value, (Tensor, Module, Function)):
            if value._session is not self:
                raise ValueError(f"{value!r} belongs to another session")
            return value._handle
        if type(value).__module__ == "numpy" and type(value).__name__ != "ndarray":
            return value.item()  # numpy scalars travel as Python scalars, not 0-d tensors
        if hasattr(value, "__array_interface__") or type(value).__name__ == "Tensor":
            return tensor_value(value)
        return value

    def object_from_wire(self, value):
        if isinstance(value, TensorHandle):
            return Tensor(self, value)
        if isinstance(value, ModuleHandle):
            return Module(self, value, None)
        if isinstance(value, FunctionHandle):
            return Function(self, value, "<remote function>")
        return value

    def device_from_wire(self, value: DeviceValue) -> Device:
        return Device(value.device_type, value.device_id, session=self)

    # ------------------------------------------------------------ public API

    def cpu(self, dev_id: int = 0) -> Device:
        return Device("cpu", dev_id, session=self)

    def device(self, dev_type="cpu", dev_id: int = 0) -> Device:
        return Device(dev_type, dev_id, session=self)

    def get_function(self, name: str) -> Function:
        """A global function registered on the server, e.g. ``"testing.echo"``.

        A name the server listed when the session began is looked up with the next request
        (GLOBAL_AT: no round trip of its own); any other is asked for now, and an unknown name
        raises here either way."""
        handle = self.channel.global_at(name)
        if handle is None:
            (handle,) = self.channel.request(GetGlobal(name))
        return Function(self, handle, name)

    def list_global_func_names(self) -> list[str]:
        (names,) = self.channel.request(ListGlobals())
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
                self.channel.upload_file(Upload(target, size), f, size, lambda: f"upload {target}")
            return
        if target is None:
            raise ValueError("upload of bytes needs a target name")
        view = memoryview(data).cast("B")
        self._check_upload(view.nbytes)
        self.channel.request_with_raw(Upload(target, view.nbytes), view, lambda: f"upload {target}")

    def _check_upload(self, size: int) -> None:
        limit = self.info["max_upload_bytes"]
        if size > limit:
            raise ValueError(f"upload of {size} bytes exceeds the server's limit of {limit} bytes "
                             "(--max-upload-bytes)")

    def download(self, name: str) -> bytearray:
        """The contents of a file in the session's workspace (received in place, no extra copy)."""
        limit = max(self.info["max_upload_bytes"], self.info["max_tensor_bytes"])
        return self.channel.fetch(Download(name), None, limit, lambda: f"download {name}")

    def remove(self, name: str) -> None:
        self.channel.request(Remove(name))

    def listdir(self, path: str = "") -> list[str]:
        (names,) = self.channel.request(ListDir(path))
        return names

    def load_module(self, name: str) -> Module:
        """Load a module uploaded to the workspace (``upload(path)`` first)."""
        handle, metadata = self.channel.request(LoadModule(name))
        return Module(self, handle, json.loads(metadata))

    def empty(self, shape, dtype="float32", dev: Device | None = None) -> Tensor:
        """Allocate a zero-filled tensor on the remote device.

        Where the server serves ALLOCATE and its checks will pass the tensor, the allocation goes
        out with the next request, without a round trip of its own (``Channel.allocate``).
        """
        dev = dev or self.cpu(0)
        if isinstance(shape, int):
            shape = (shape,)
        dtype = getattr(dtype, "name", None) or str(dtype)
        device = DeviceValue(dev.device_type, dev.device_id)
        if self._array_op:
            shape = tuple(shape)
            nbytes = _layout_bytes(dtype, shape)
            handle = self.channel.allocate(dtype, shape, device, nbytes)
            if handle is not None:
                return Tensor(self, handle, dev)
            (handle_id,) = self.channel.request_with_raw(Array(list(shape), dtype, device, 0), _NO_BYTES,
                                                         None, nbytes)
            return self._new_tensor(handle_id, shape, dtype, device, dev)
        (handle,) = self.channel.request(Empty(list(shape), dtype, device))
        return Tensor(self, handle)

    def array(self, source, dev: Device | None = None) -> Tensor:
        """A remote tensor holding a copy of ``source`` (an ndarray or anything numpy accepts):
        allocated and filled with one request where the server serves ARRAY."""
        import numpy as np

        array = np.require(source, requirements="C")
        dev = dev or self.cpu(0)
        if not self._array_op:
            return self.empty(array.shape, array.dtype.name, dev).copyfrom(array)
        shape, dtype = array.shape, _dtype_name(array.dtype)
        nbytes_of(dtype, shape)  # a dtype the protocol carries, else ProtocolError here
        device = DeviceValue(dev.device_type, dev.device_id)
        view = byte_view(array)
        (handle_id,) = self.channel.request_with_raw(Array(list(shape), dtype, device, view.nbytes), view,
                                                     lambda: f"copy to {dtype}{list(shape)}", view.nbytes)
        return self._new_tensor(handle_id, shape, dtype, device, dev)

    def _new_tensor(self, handle_id, shape, dtype: str, device: DeviceValue, dev: Device) -> Tensor:
        if type(handle_id) is not int:
            self.channel.mark_closed()
            raise ConnectionLost(f"the server answered ARRAY with a {type(handle_id).__name__}, not an id")
        return Tensor(self, TensorHandle(handle_id, dtype, tuple(shape), device), dev)

    # ------------------------------------------------------------ for code written before the channel

    @property
    def _conn(self):
        """The transport (kept for callers that reached into the session; use ``channel.conn``)."""
        return self.channel.conn

    def _mark_closed(self) -> None:
        self.channel.mark_closed()

    def _receive(self) -> tuple[int, bytes]:
        return self.channel.receive()

    def _expect(self, frame: tuple[int, bytes], frame_type: int):
        return self.channel.expect(frame, frame_type)


__all__ = ["RPCSession", "connect", "open_session", "Tensor", "Module", "Function", "TimeEvaluator",
           "PROGRESS_MIN_BYTES"]
