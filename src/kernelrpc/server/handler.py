"""One session's request loop, run inside the session's child process.

Remote objects live in a handle table; the client holds only their ids. Every
request is answered with RETURN, ERROR or DATA; an exception raised while
serving a request becomes an ERROR frame with the type, message and traceback,
and the session goes on.
"""
from __future__ import annotations

import json
import logging
import os
import time
import traceback

from .. import runtime
from ..errors import ConnectionLost, ProtocolError
from ..rpc import protocol as P
from ..rpc.transport import FramedSocket
from ..rpc.values import (DeviceValue, FunctionHandle, ModuleHandle, TensorHandle, TensorValue,
                          nbytes_of)
from . import canary, registry
from .config import ServerConfig
from .workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)


_PLAIN = frozenset({int, float, str, bytes, bool, type(None)})


def _expect(args: list, *kinds) -> list:
    if len(args) != len(kinds):
        raise ProtocolError(f"expected {len(kinds)} arguments, got {len(args)}")
    for i, (value, kind) in enumerate(zip(args, kinds)):
        if kind is int and (type(value) is not int):
            raise ProtocolError(f"argument {i} must be an integer, got {type(value).__name__}")
        if kind is not int and not isinstance(value, kind):
            raise ProtocolError(f"argument {i} must be {getattr(kind, '__name__', kind)}, "
                                f"got {type(value).__name__}")
    return args


class SessionIdle(ConnectionLost):
    """The client sent no request for the server's idle timeout."""


class TransferTooSlow(ConnectionLost):
    """An upload or tensor copy arrives slower than the server's minimum rate."""


_PACE_CHUNK = 1 << 16


def socket_timed_out(exc: ConnectionLost) -> bool:
    """Whether a receive or send ended because the socket's timeout (SO_RCVTIMEO/SO_SNDTIMEO) passed."""
    return isinstance(exc.__cause__, (BlockingIOError, TimeoutError))


class SessionHandler:
    def __init__(self, conn: FramedSocket, workspace: Workspace, config: ServerConfig) -> None:
        self.conn = conn
        self.workspace = workspace
        self.config = config
        self._objects: dict[int, object] = {}
        self._next_id = 1
        self.tensor_bytes = 0           # held by the tensors this session allocated (max_session_bytes)
        self._allocated: dict[int, int] = {}    # handle -> bytes, for the tensors EMPTY made
        self._ops = {
            P.GET_GLOBAL: self._get_global, P.LIST_GLOBALS: self._list_globals,
            P.LOAD_MODULE: self._load_module, P.GET_FUNCTION: self._get_function,
            P.FREE: self._free, P.EMPTY: self._empty,
            P.COPY_TO: self._copy_to, P.COPY_FROM: self._copy_from, P.UPLOAD: self._upload,
            P.DOWNLOAD: self._download, P.REMOVE: self._remove, P.LISTDIR: self._listdir,
            P.TIME_EVALUATOR: self._time_evaluator,
        }

    def serve(self) -> None:
        """Answer requests until the client shuts the session down or disconnects.

        CALL, the request that measurement loops repeat, is served inline: usually it arrives
        whole in one read and is decoded straight from it, and the function is called here
        rather than through the table of operations.
        """
        conn = self.conn
        recv_chunk, feed, send = conn.recv_chunk, conn.reader.feed, conn.sock.sendall
        decode_call_frame, encode_scalar_result, max_frame_bytes = P.decode_call_frame, \
            P.encode_scalar_result, self.config.max_frame_bytes
        objects, CALL = self._objects, P.CALL
        idle_timeout, monotonic = self.config.idle_timeout, time.monotonic
        checked = self.config.checked_tensors
        while True:
            waiting_since = monotonic()
            while True:
                try:
                    chunk = recv_chunk()
                    break
                except ConnectionLost as exc:   # each receive waits at most the socket's timeout
                    if not socket_timed_out(exc):
                        raise
                    idle = monotonic() - waiting_since
                    if idle_timeout and idle >= idle_timeout:
                        raise SessionIdle(f"no request for {idle:.0f} s; the server ended the session "
                                          "(its --idle-timeout)") from None
            call = None if chunk is None else decode_call_frame(chunk, max_frame_bytes)
            if call is None:
                if chunk is not None:
                    feed(chunk)
                op, args = self._next_request()
                if op == CALL:
                    call = args
                elif op == P.SHUTDOWN:
                    return
                else:
                    reply = self._answer(op, args)
            if call is not None:
                function_id, args = call
                try:
                    func = objects.get(function_id)
                    if func is None:
                        raise LookupError(f"no function with handle {function_id} in this session "
                                          "(freed already?)")
                    if type(args) is not tuple:  # a tuple holds ints and floats only (decode_call_frame)
                        args = self._args_to_local(args)
                    result = func(*args)
                    if checked:
                        canary.check_arguments(args)
                    reply = encode_scalar_result(result)
                    if reply is None:
                        reply = P.encode_result(result if type(result) in _PLAIN else self._to_wire(result))
                except ConnectionLost:
                    raise
                except Exception as exc:  # reported to the client, the session goes on
                    log.debug("CALL failed", exc_info=True)
                    reply = self._error_reply(CALL, args, exc)
            if reply is not None:
                try:
                    send(reply)
                except OSError as exc:
                    raise ConnectionLost(f"connection lost while sending: {exc}") from exc

    def _next_request(self) -> tuple[int, object]:
        """``(op, args)`` of the next request frame; for CALL, args is ``(function_id, args)``."""
        frame_type, body = self.conn.recv_frame()
        if frame_type != P.REQUEST:
            raise ProtocolError(f"expected a REQUEST frame, got {P.FRAME_NAMES[frame_type]}")
        if body and body[0] == P.CALL:
            return P.CALL, P.decode_call(body)
        return P.decode_request(body)

    def _answer(self, op: int, args: list) -> bytes | None:
        """The reply to a request other than CALL (None when the operation sent it itself)."""
        try:
            return self._ops[op](args)
        except ConnectionLost:
            raise
        except Exception as exc:  # reported to the client, the session goes on
            log.debug("%s failed", P.OPS[op], exc_info=True)
            return self._error_reply(op, args, exc)

    def _error_reply(self, op: int, args, exc: Exception) -> bytes:
        """The ERROR frame for a failed request, after dropping any raw bytes that followed it."""
        if op in P.OPS_WITH_RAW_INPUT and not getattr(exc, "raw_consumed", False):
            self._skip_raw_input(args)
        trace = traceback.format_exception(type(exc), exc, exc.__traceback__)  # Python 3.9's form
        return P.encode_error(type(exc).__name__, str(exc), "".join(trace))

    def _skip_raw_input(self, args: list) -> None:
        nbytes = args[-1] if args and type(args[-1]) is int else -1
        limit = max(self.config.max_tensor_bytes, self.config.max_upload_bytes)
        if not 0 <= nbytes <= limit:
            raise ProtocolError(f"refused transfer announces {nbytes} bytes; cannot stay in step")
        self.conn.discard_raw(nbytes)

    # ------------------------------------------------------------ handles

    def _put(self, obj) -> int:
        handle = self._next_id
        self._next_id += 1
        self._objects[handle] = obj
        return handle

    def _lookup(self, handle: int, kind: type, what: str):
        obj = self._objects.get(handle)
        if obj is None or not isinstance(obj, kind):
            raise LookupError(f"no {what} with handle {handle} in this session (freed already?)")
        return obj

    def _tensor(self, value) -> runtime.Tensor:
        if not isinstance(value, TensorHandle):
            raise ProtocolError(f"expected a tensor handle, got {type(value).__name__}")
        return self._lookup(value.id, runtime.Tensor, "tensor")

    def _args_to_local(self, args: list) -> list:
        for arg in args:
            if type(arg) not in _PLAIN:
                return [self._to_local(a) for a in args]
        return args

    def _to_local(self, value):
        """A decoded argument as the runtime object it stands for."""
        if type(value) in _PLAIN:
            return value
        if isinstance(value, TensorHandle):
            return self._tensor(value)
        if isinstance(value, ModuleHandle):
            return self._lookup(value.id, runtime.Module, "module")
        if isinstance(value, FunctionHandle):
            return self._lookup(value.id, object, "function")
        if isinstance(value, DeviceValue):
            return runtime.Device(value.device_type, value.device_id)
        if isinstance(value, TensorValue):
            tensor = runtime.Tensor(value.shape, value.dtype, runtime.Device(value.device.device_type,
                                                                             value.device.device_id))
            tensor.buffer[:] = value.data   # lives for this call only: not counted in the session's bytes
            return tensor
        if isinstance(value, list):
            return [self._to_local(v) for v in value]
        return value

    def _to_wire(self, value):
        """A result as a wire value; runtime objects stay here and travel as handles."""
        if type(value) in _PLAIN:
            return value
        if isinstance(value, runtime.Tensor):
            return self._tensor_handle(value)
        if isinstance(value, runtime.Module):
            return ModuleHandle(self._put(value))
        if isinstance(value, runtime.Device):
            return DeviceValue(value.device_type, value.device_id)
        if isinstance(value, runtime.ProfileResult):
            return json.dumps(value.to_dict())
        if isinstance(value, (list, tuple)):
            return [self._to_wire(v) for v in value]
        if callable(value):
            return FunctionHandle(self._put(value))
        return value

    def _tensor_handle(self, tensor: runtime.Tensor) -> TensorHandle:
        device = DeviceValue(tensor.device.device_type, tensor.device.device_id)
        return TensorHandle(self._put(tensor), tensor.dtype, tuple(tensor.shape), device)

    # ------------------------------------------------------------ operations

    def _get_global(self, args):
        (name,) = _expect(args, str)
        func = self._session_functions().get(name) or registry.get(name)
        return P.encode_return([FunctionHandle(self._put(func))])

    def _list_globals(self, args):
        _expect(args)
        return P.encode_return([sorted([*registry.names(), *self._session_functions()])])

    def _session_functions(self) -> dict:
        """Globals that look at this session (handle leaks show up here during long runs)."""
        return {"session.live_handles": lambda: len(self._objects) - 1}  # minus this function

    def _load_module(self, args):
        (name,) = _expect(args, str)
        module = runtime.load_module(str(self.workspace.existing_file(name)))
        return P.encode_return([ModuleHandle(self._put(module)), json.dumps(module.metadata)])

    def _get_function(self, args):
        module_handle, name = _expect(args, ModuleHandle, str)
        module = self._lookup(module_handle.id, runtime.Module, "module")
        return P.encode_return([FunctionHandle(self._put(module.get_function(name)))])

    def _free(self, args):
        for value in args:
            if isinstance(value, (ModuleHandle, FunctionHandle, TensorHandle)):
                obj = self._objects.pop(value.id, None)
                if isinstance(obj, runtime.Tensor):
                    self.tensor_bytes -= self._allocated.pop(value.id, 0)
                    obj.free()
        return P.encode_return()

    def _empty(self, args):
        shape, dtype, device = _expect(args, list, str, DeviceValue)
        nbytes = nbytes_of(dtype, shape)
        if nbytes > self.config.max_tensor_bytes:
            raise MemoryError(f"tensor of {nbytes} bytes exceeds the server's limit of "
                              f"{self.config.max_tensor_bytes} bytes (max_tensor_bytes)")
        if self.tensor_bytes + nbytes > self.config.max_session_bytes:
            raise MemoryError(f"a tensor of {nbytes} bytes would bring this session's tensors to "
                              f"{self.tensor_bytes + nbytes} bytes, beyond the server's limit of "
                              f"{self.config.max_session_bytes} bytes per session (--max-session-bytes); "
                              "free tensors you no longer need")
        tensor = runtime.Tensor(tuple(shape), dtype, runtime.Device(device.device_type, device.device_id))
        if self.config.checked_tensors:
            canary.guard(tensor)
        handle = self._tensor_handle(tensor)
        self._allocated[handle.id] = nbytes
        self.tensor_bytes += nbytes
        return P.encode_return([handle])

    def _tensor_range(self, args) -> memoryview:
        handle, offset, nbytes = _expect(args, TensorHandle, int, int)
        tensor = self._tensor(handle)
        if offset < 0 or nbytes < 0 or offset + nbytes > tensor.nbytes:
            raise ValueError(f"byte range [{offset}, {offset + nbytes}) is outside the tensor's "
                             f"{tensor.nbytes} bytes")
        return tensor.buffer[offset:offset + nbytes]

    def _copy_to(self, args):
        target = self._tensor_range(args)
        self._receive_raw(target, self._pace_deadline(len(target)))
        return P.encode_return()

    def _copy_from(self, args):
        source = self._tensor_range(args)
        self.conn.send_with_raw(P.encode_data_header(len(source)), source)
        return None

    def _upload(self, args):
        name, nbytes = _expect(args, str, int)
        if not 0 <= nbytes <= self.config.max_upload_bytes:
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
        if deadline is None:
            self.conn.recv_raw_into(view)
            return
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

    def _download(self, args):
        (name,) = _expect(args, str)
        path = self.workspace.existing_file(name)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.conn.send(P.encode_data_header(size))
            sent = self.conn.sock.sendfile(f, 0, size) if size else 0
            if sent != size:
                raise ProtocolError(f"{name!r} changed size while it was being sent")
        return None

    def _remove(self, args):
        (name,) = _expect(args, str)
        self.workspace.remove_file(name)
        return P.encode_return()

    def _listdir(self, args):
        (name,) = _expect(args, str)
        return P.encode_return([self.workspace.listdir(name)])

    def _time_evaluator(self, args):
        (module_handle, name, device, number, repeat, min_repeat_ms, cooldown_interval_ms,
         repeats_to_cooldown, f_preproc, limit_zero_time_iterations, cache_flush_bytes) = _expect(
            args, ModuleHandle, str, DeviceValue, int, int, float, float, int, str, int, int)
        module = self._lookup(module_handle.id, runtime.Module, "module")
        timer = module.time_evaluator(
            name, runtime.Device(device.device_type, device.device_id), number=number, repeat=repeat,
            min_repeat_ms=min_repeat_ms, cooldown_interval_ms=cooldown_interval_ms,
            repeats_to_cooldown=repeats_to_cooldown, f_preproc=f_preproc,
            limit_zero_time_iterations=limit_zero_time_iterations, cache_flush_bytes=cache_flush_bytes)
        return P.encode_return([FunctionHandle(self._put(timer))])
