"""One session's request loop, run inside the session's child process.

Remote objects live in a handle table; the client holds only their ids. Every
request (wire/requests.py) is answered with RETURN, ERROR or DATA, except SHUTDOWN
and RELEASE, which have no reply. A request that does not decode or check out, and
an exception raised while serving one, become an ERROR frame with the type,
message and traceback, and the session goes on; only a request whose raw bytes
cannot be skipped (their length is unknown) ends it.
"""
from __future__ import annotations

import json
import logging
import os
import time
import traceback

from .. import runtime
from ..errors import ConnectionLost, ProtocolError
from ..wire import protocol as P
from ..wire.profile import encode_profile
from ..wire.convert import PLAIN, Converter, local_tensor
from ..wire.connection import RepeatedCall, ServerConnection, SessionAccount
from ..wire.requests import CLIENT_IDS_FIRST, CLIENT_IDS_LAST, NO_REPLY, WITH_RAW_INPUT, Op, TimeEvaluatorPacked
from ..wire.transport import FIRST_READ, PEER_CLOSED, FramedSocket, receive_failed
from ..wire.values import (DeviceValue, FunctionHandle, ModuleHandle, TensorHandle, TensorValue,
                           decode_values, nbytes_of)
from ..runtime.module import Function as Kernel
from ..runtime.prefault import prefault
from . import canary, registry
from .config import ServerConfig
from .workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)
_encode_result = P.encode_result  # a module global: one lookup on the CALL path, not two
_NONE_RETURN = P.encode_result(None)
_HANDLES_ONLY = frozenset([TensorHandle])


class SessionIdle(ConnectionLost):
    """The client sent no request for the server's idle timeout."""


class TransferTooSlow(ConnectionLost):
    """An upload or tensor copy arrives slower than the server's minimum rate."""


_PACE_CHUNK = 1 << 16


class AllocationFailed(MemoryError):
    """A request used a tensor whose ALLOCATE failed (the client did not wait to hear it); the
    client raises it as :class:`kernelrpc.errors.AllocationFailed`."""


class Unallocated:
    """What the handle table holds under a client's id whose ALLOCATE failed: the failure, raised
    (as AllocationFailed, from the original error) by every request that uses the id until it is
    freed."""

    __slots__ = ("error", "layout")

    def __init__(self, error: BaseException, layout: str) -> None:
        traceback.clear_frames(error.__traceback__)  # keep the traceback's text, not its locals
        self.error = error
        self.layout = layout

    def raise_for(self, handle: int):
        raise AllocationFailed(f"tensor {handle} ({self.layout}) could not be allocated on the device when "
                               f"empty() asked for it: {type(self.error).__name__}: {self.error}") from self.error


def socket_timed_out(exc: ConnectionLost) -> bool:
    """Whether a receive or send ended because the socket's timeout (SO_RCVTIMEO/SO_SNDTIMEO) passed."""
    return isinstance(exc.__cause__, (BlockingIOError, TimeoutError))


class HandleTable(Converter):
    """The session's objects by handle id, and the conversion of values to and from them."""

    def __init__(self) -> None:
        self.objects: dict[int, object] = {}
        self._next_id = 1

    def put(self, obj) -> int:
        handle = self._next_id
        if handle >= CLIENT_IDS_FIRST:
            raise MemoryError(f"this session has used all {CLIENT_IDS_FIRST - 1} handle ids of the server")
        self._next_id += 1
        self.objects[handle] = obj
        return handle

    def lookup(self, handle: int, kind: type, what: str):
        obj = self.objects.get(handle)
        if obj is None or not isinstance(obj, kind):
            if type(obj) is Unallocated:
                obj.raise_for(handle)
            raise LookupError(f"no {what} with handle {handle} in this session (freed already?)")
        return obj

    def tensor(self, value) -> runtime.Tensor:
        if not isinstance(value, TensorHandle):
            raise ProtocolError(f"expected a tensor handle, got {type(value).__name__}")
        return self.lookup(value.id, runtime.Tensor, "tensor")

    def tensor_handle(self, tensor: runtime.Tensor) -> TensorHandle:
        device = DeviceValue(tensor.device.device_type, tensor.device.device_id)
        return TensorHandle(self.put(tensor), tensor.dtype, tuple(tensor.shape), device)

    def from_wire(self, value):
        if type(value) is TensorHandle:  # a kernel call's arguments: one lookup, not four calls deep
            obj = self.objects.get(value.id)
            if type(obj) is runtime.Tensor:
                return obj
        return Converter.from_wire(self, value)

    def all_from_wire(self, values) -> list:
        """A call's arguments as objects, each by ``from_wire`` (a tensor handle in one lookup),
        without the base class's first pass that looks for a value that is not plain."""
        from_wire = self.from_wire
        return [from_wire(value) for value in values]

    def object_from_wire(self, value):
        """A decoded argument as the runtime object it stands for."""
        if isinstance(value, TensorHandle):
            return self.tensor(value)
        if isinstance(value, ModuleHandle):
            return self.lookup(value.id, runtime.Module, "module")
        if isinstance(value, FunctionHandle):
            return self.lookup(value.id, object, "function")
        if isinstance(value, TensorValue):
            return local_tensor(value)  # lives for this call only: not counted in the session's bytes
        return value

    def object_to_wire(self, value):
        """A result as a wire value; runtime objects stay here and travel as handles."""
        if isinstance(value, runtime.Tensor):
            return self.tensor_handle(value)
        if isinstance(value, runtime.Module):
            return ModuleHandle(self.put(value))
        if isinstance(value, runtime.ProfileResult):
            return json.dumps(value.to_dict())
        if callable(value):
            return FunctionHandle(self.put(value))
        return value


def session_connection(config: ServerConfig) -> ServerConnection:
    """The server's side of a new session, with the server's limits."""
    return ServerConnection(config.max_frame_bytes, SessionAccount(
        config.max_tensor_bytes, config.max_session_bytes, config.max_client_tensors))


class SessionHandler:
    """The session's operations over its connection: ``conn`` is the transport (FramedSocket)
    whose reader is the session's ServerConnection (None: driven without a network, tests)."""

    def __init__(self, conn: FramedSocket | None, workspace: Workspace, config: ServerConfig) -> None:
        self.conn = conn
        #: The session connection: framing, requests, the kept calls, the limits' accounting.
        self.connection = conn.reader if conn is not None else session_connection(config)
        #: The tensors EMPTY, ARRAY and ALLOCATE made and the entries under the client's ids.
        self.account = self.connection.account
        self.workspace = workspace
        self.config = config
        self.handles = HandleTable()
        self._objects = self.handles.objects
        self._checked = config.checked_tensors
        #: Globals that look at this session (handle leaks show up here during long runs).
        self._session_globals = {"session.live_handles": lambda: len(self._objects) - 1}  # minus itself
        self._handlers = {op.value: handler for op, handler in {
            Op.GET_GLOBAL: self._get_global, Op.LIST_GLOBALS: self._list_globals,
            Op.LOAD_MODULE: self._load_module, Op.GET_FUNCTION: self._get_function, Op.CALL: self._call,
            Op.FREE: self._free, Op.RELEASE: self._release, Op.EMPTY: self._empty, Op.ARRAY: self._array,
            Op.COPY_TO: self._copy_to, Op.COPY_FROM: self._copy_from, Op.UPLOAD: self._upload,
            Op.DOWNLOAD: self._download, Op.REMOVE: self._remove, Op.LISTDIR: self._listdir,
            Op.TIME_EVALUATOR: self._time_evaluator, Op.TIME_EVALUATOR_PACKED: self._time_evaluator,
            Op.ALLOCATE: self._allocate_at, Op.GLOBAL_AT: self._global_at,
        }.items()}  # keyed by int: an Op key costs a slower lookup per request

    def serve(self) -> None:
        """Answer requests until the client shuts the session down or disconnects.

        Fast path (docs/performance.md): a CALL that arrives whole in one read is decoded
        straight from it (ServerConnection.call_from_read) and goes to ``_call`` without the table.
        """
        conn, connection = self.conn, self.connection
        recv, first_read = conn.sock.recv, FIRST_READ
        recv_frame, send = conn.recv_frame, conn.sock.sendall
        handlers, request_of, shutdown = self._handlers, connection.request_of, P.SHUTDOWN
        call, call_from_read = self._call, connection.call_from_read
        while True:
            if connection.pending:  # frame bytes buffered: the reader takes those first
                frame_type, body = recv_frame()
            else:
                try:
                    chunk = recv(first_read)  # FramedSocket.recv_chunk, one call less per request
                except OSError as exc:
                    frame_type, body = self._wait_for_frame(receive_failed(exc))
                    chunk = None
                if chunk is not None:
                    if not chunk:
                        raise ConnectionLost(PEER_CLOSED)
                    try:
                        request = call_from_read(chunk)
                        reply = None if request is None else call(request)
                    except ConnectionLost:
                        raise
                    except Exception as exc:  # reported to the client, the session goes on
                        request, reply = True, self._error_reply(P.CALL, b"", exc)
                    if request is not None:
                        try:
                            send(reply)
                        except OSError as exc:
                            raise ConnectionLost(f"connection lost while sending: {exc}") from exc
                        continue
                    frame_type, body = recv_frame(chunk)
            if frame_type != P.REQUEST:
                raise ProtocolError(f"expected a REQUEST frame, got {P.FRAME_NAMES[frame_type]}")
            op = body[0] if body else 0
            if op == shutdown:
                return
            try:
                request = request_of(body)  # first: it names an unknown op
                reply = handlers[op](request)
            except ConnectionLost:
                raise
            except Exception as exc:  # reported to the client, the session goes on
                reply = self._error_reply(op, body, exc)
            if reply is not None:
                try:
                    send(reply)
                except OSError as exc:
                    raise ConnectionLost(f"connection lost while sending: {exc}") from exc

    def _wait_for_frame(self, exc: ConnectionLost) -> tuple[int, bytes]:
        """After a receive timed out: wait for the next frame up to the idle timeout, one socket
        timeout at a time (a frame that stalls once begun ends the session at the first one)."""
        timeout = self.config.socket_timeout()
        waiting_since = time.monotonic() - timeout   # the receive that timed out waited that long
        while True:
            if not socket_timed_out(exc) or self.conn.reader.pending:
                raise exc
            idle = time.monotonic() - waiting_since
            if self.config.idle_timeout and idle >= self.config.idle_timeout:
                raise SessionIdle(f"no request for {idle:.0f} s; the server ended the session "
                                  "(its --idle-timeout)") from None
            try:
                return self.conn.recv_frame()
            except ConnectionLost as again:
                exc = again

    def _error_reply(self, op: int, body: bytes, exc: Exception) -> bytes | None:
        """The ERROR frame for a failed request, after dropping any raw bytes that followed it."""
        name = P.OPS.get(op, f"operation {op}")
        log.debug("%s failed", name, exc_info=True)
        if op in WITH_RAW_INPUT and not getattr(exc, "raw_consumed", False):
            self._skip_raw_input(body)
        if op == P.ALLOCATE or op == P.GLOBAL_AT:  # the client counts on it and hears nothing: it cannot go on in step
            raise ProtocolError(f"{name} refused, the session ends: {exc}") from None
        if op in NO_REPLY:
            log.warning("%s failed (it has no reply to report it in): %s", name, exc)
            return None
        trace = traceback.format_exception(type(exc), exc, exc.__traceback__)  # Python 3.9's form
        return P.encode_error(type(exc).__name__, str(exc), "".join(trace))

    def _skip_raw_input(self, body: bytes) -> None:
        """Drop the raw bytes after a refused request: their count is its last value."""
        try:
            values = decode_values(body, 1)
        except ProtocolError:
            values = []
        nbytes = values[-1] if values and type(values[-1]) is int else -1
        limit = max(self.config.max_tensor_bytes, self.config.max_upload_bytes)
        if not 0 <= nbytes <= limit:
            raise ProtocolError(f"refused transfer announces {nbytes} bytes; cannot stay in step")
        self.conn.discard_raw(nbytes)

    # ------------------------------------------------------------ operations

    def _call(self, request):
        if type(request) is RepeatedCall:  # a kernel's call kept by the connection: prepared if repeated
            prepared = request.prepared
            if prepared is not None and prepared.run():
                if self._checked:
                    canary.check_arguments(prepared.tensors)
                return _NONE_RETURN
            return self._call_kernel(request.function_id, self._objects[request.function_id], request.args, True)
        function_id, args = request
        func = self._objects.get(function_id)
        if func is None:
            raise LookupError(f"no function with handle {function_id} in this session (freed already?)")
        if type(args) is not tuple:  # a tuple is call_from_read's one int argument
            if type(func) is Kernel:
                return self._call_kernel(function_id, func, args, False)
            args = self.handles.all_from_wire(args)
        result = func(*args)
        if self._checked:
            canary.check_arguments(args)
        return _encode_result(result if type(result) in PLAIN else self.handles.to_wire(result))

    def _call_kernel(self, function_id: int, kernel: Kernel, args: list, again: bool) -> bytes:
        """A kernel's call. One whose arguments are all tensor handles is kept by the connection as
        the function's last (``keep_call``); the second in a row with the same handles (``again``:
        a RepeatedCall) is prepared (``Kernel.prepare``: the tensors checked and the argument
        array filled once), and kept with it: the calls with those handles after it run prepared."""
        objects = self.handles.all_from_wire(args)
        if not args or not _HANDLES_ONLY.issuperset(map(type, args)):  # (inline tensors live for one call)
            kernel(*objects)
        else:
            prepared = kernel.prepare(objects) if again else None
            if prepared is None:
                kernel(*objects)
            else:
                prepared.run()
            self.connection.keep_call(function_id, args, prepared)
        if self._checked:
            canary.check_arguments(objects)
        return _NONE_RETURN

    def _get_global(self, request):
        func = self._session_globals.get(request.name) or registry.get(request.name)
        return P.encode_return([FunctionHandle(self.handles.put(func))])

    def _list_globals(self, request):
        return P.encode_return([sorted([*registry.names(), *self._session_globals])])

    def _load_module(self, request):
        module = runtime.load_module(str(self.workspace.existing_file(request.name)))
        return P.encode_return([ModuleHandle(self.handles.put(module)), json.dumps(module.metadata)])

    def _get_function(self, request):
        module = self.handles.lookup(request.module.id, runtime.Module, "module")
        return P.encode_return([FunctionHandle(self.handles.put(module.get_function(request.name)))])

    def _free(self, request):
        self._drop(handle.id for handle in request.handles)
        return P.encode_return()

    def _release(self, request):
        self._drop(request.ids)
        return None

    def _drop(self, ids) -> None:
        kept_ids, account = self.connection.kept_ids, self.account
        for handle_id in ids:
            obj = self._objects.pop(handle_id, None)
            if handle_id in kept_ids:
                self.connection.forget(handle_id)
            account.remove(handle_id)
            if isinstance(obj, runtime.Tensor):
                obj.free()

    def _allocate(self, shape, dtype: str, device: DeviceValue, nbytes: int,
                  handle_id: int | None = None) -> tuple[int, runtime.Tensor]:
        """A new zero-filled tensor of ``nbytes`` (its checked layout's size) in the handle table,
        within the server's limits, under ``handle_id`` (a client's, free) or a new id."""
        refused = self.account.bytes_refused(nbytes)
        if refused:
            raise MemoryError(refused)
        tensor = runtime.Tensor(tuple(shape), dtype, runtime.Device(device.device_type, device.device_id))
        if self.config.checked_tensors:
            canary.guard(tensor)
        if handle_id is None:
            handle_id = self.handles.put(tensor)
        else:
            self._objects[handle_id] = tensor
        self.account.add(handle_id, nbytes)
        return handle_id, tensor

    def _empty(self, request):
        nbytes = nbytes_of(request.dtype, request.shape)
        handle_id, tensor = self._allocate(request.shape, request.dtype, request.device, nbytes)
        return P.encode_return([TensorHandle(handle_id, tensor.dtype, tuple(tensor.shape), request.device)])

    def _array(self, request):
        nbytes = nbytes_of(request.dtype, request.shape)
        if request.nbytes not in (0, nbytes):
            raise ValueError(f"ARRAY of {request.dtype}{list(request.shape)} takes {nbytes} bytes "
                             f"or none, not {request.nbytes}")
        handle_id, tensor = self._allocate(request.shape, request.dtype, request.device, nbytes)
        if request.nbytes:
            try:
                self._receive_raw(tensor.buffer, self._pace_deadline(nbytes))
            except BaseException:
                self._drop((handle_id,))
                raise
        return P.encode_return([handle_id])

    def _check_client_id(self, name: str, handle_id: int) -> None:
        """Check ``handle_id`` for a new entry under an id the client chose (ALLOCATE, GLOBAL_AT); a
        ProtocolError (the session ends, _error_reply) if it is outside their range, in use, or
        past the server's ``max_client_tensors``."""
        if not CLIENT_IDS_FIRST <= handle_id <= CLIENT_IDS_LAST:
            raise ProtocolError(f"{name}: id {handle_id} is outside the ids a client may choose "
                                f"[{CLIENT_IDS_FIRST}, {CLIENT_IDS_LAST}]")
        if handle_id in self._objects:
            raise ProtocolError(f"{name}: id {handle_id} is in use")
        refused = self.account.entry_refused()
        if refused:
            raise ProtocolError(f"{name}: {refused}")

    def _allocate_at(self, request):
        """ALLOCATE: no reply; a failure to allocate is kept under the id (Unallocated), a bad id
        ends the session (_error_reply)."""
        tensor = request.tensor
        handle_id = tensor.id
        self._check_client_id("ALLOCATE", handle_id)
        try:
            self._allocate(tensor.shape, tensor.dtype, tensor.device, nbytes_of(tensor.dtype, tensor.shape),
                           handle_id)
        except (MemoryError, OSError) as exc:   # the server's limits, or the device's memory
            log.debug("ALLOCATE of %d failed", handle_id, exc_info=True)
            self._objects[handle_id] = Unallocated(exc, f"{tensor.dtype}{list(tensor.shape)}")
            self.account.add(handle_id, 0)      # an entry under the client's id all the same
        return None

    def _global_at(self, request):
        """GLOBAL_AT: no reply; the client sends it only for a name the hello listed, so an
        unknown name, like a bad id, ends the session (_error_reply)."""
        func = registry.get(request.name)
        self._check_client_id("GLOBAL_AT", request.function.id)
        self._objects[request.function.id] = func
        self.account.add(request.function.id, 0)
        return None

    def _tensor_range(self, request) -> memoryview:
        tensor = self.handles.tensor(request.tensor)
        offset, nbytes = request.offset, request.nbytes
        if offset + nbytes > tensor.nbytes:
            raise ValueError(f"byte range [{offset}, {offset + nbytes}) is outside the tensor's "
                             f"{tensor.nbytes} bytes")
        return tensor.buffer[offset:offset + nbytes]

    def _copy_to(self, request):
        target = self._tensor_range(request)
        self._receive_raw(target, self._pace_deadline(len(target)))
        return P.encode_return()

    def _copy_from(self, request):
        source = self._tensor_range(request)
        self.conn.send_with_raw(P.encode_data_header(len(source)), source)
        return None

    def _upload(self, request):
        name, nbytes = request
        if nbytes > self.config.max_upload_bytes:
            raise WorkspaceError(f"upload of {nbytes} bytes exceeds the server's limit of "
                                 f"{self.config.max_upload_bytes} bytes (--max-upload-bytes)")
        path, out = self.workspace.open_for_upload(name)
        with out:
            try:
                self._receive_into_file(out, nbytes)
            except BaseException:
                path.unlink(missing_ok=True)  # no half-written files
                raise
        return P.encode_return()

    def _pace_deadline(self, nbytes: int) -> float | None:
        rate = self.config.min_transfer_rate
        return time.monotonic() + self.config.io_timeout + nbytes / rate if rate else None

    def _receive_raw(self, target, deadline: float | None) -> None:
        """``recv_raw_into``, in pieces between which the pace is checked: a transfer that
        would end after ``deadline`` ends the session (it cannot be refused in step)."""
        view = memoryview(target).cast("B")
        if deadline is None or len(view) <= self.conn.reader.pending:  # no wait: nothing to pace
            self.conn.recv_raw_into(view)
            return
        prefault(view)  # pieces below prefault's threshold: map the whole target in at once
        for pos in range(0, len(view), _PACE_CHUNK):
            if time.monotonic() > deadline:
                raise TransferTooSlow(f"a transfer is slower than the server's minimum of "
                                      f"{self.config.min_transfer_rate} bytes/s (--min-transfer-rate); "
                                      "the server ended the session")
            self.conn.recv_raw_into(view[pos:pos + _PACE_CHUNK])

    def _receive_into_file(self, out, nbytes: int) -> None:
        chunk = bytearray(min(nbytes, 1 << 20))
        left = nbytes
        deadline = self._pace_deadline(nbytes)
        while left:
            part = memoryview(chunk)[:min(left, len(chunk))]
            self._receive_raw(part, deadline)
            left -= len(part)
            try:
                out.write(part)
            except OSError as exc:  # disk full: drain the rest so the stream stays in step
                self.conn.discard_raw(left)
                exc.raw_consumed = True
                raise

    def _download(self, request):
        name = request.name
        path = self.workspace.existing_file(name)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.conn.send(P.encode_data_header(size))
            sent = self.conn.sock.sendfile(f, 0, size) if size else 0
            if sent != size:
                raise ProtocolError(f"{name!r} changed size while it was being sent")
        return None

    def _remove(self, request):
        self.workspace.remove_file(request.name)
        return P.encode_return()

    def _listdir(self, request):
        return P.encode_return([self.workspace.listdir(request.name)])

    def _time_evaluator(self, request):
        module = self.handles.lookup(request.module.id, runtime.Module, "module")
        device = runtime.Device(request.device.device_type, request.device.device_id)
        timer = module.time_evaluator(
            request.name, device, number=request.number, repeat=request.repeat,
            min_repeat_ms=request.min_repeat_ms, cooldown_interval_ms=request.cooldown_interval_ms,
            repeats_to_cooldown=request.repeats_to_cooldown, f_preproc=request.f_preproc,
            limit_zero_time_iterations=request.limit_zero_time_iterations,
            cache_flush_bytes=request.cache_flush_bytes)
        if type(request) is TimeEvaluatorPacked:
            timer = _packed(timer)
        return P.encode_return([FunctionHandle(self.handles.put(timer))])


def _packed(timer):
    """``timer`` answering with its result packed (wire/profile.py) instead of JSON."""
    run = timer.run

    def packed_timer(*args):
        results, conditions = run(*args)
        return encode_profile(timer.number, results, conditions)

    return packed_timer
