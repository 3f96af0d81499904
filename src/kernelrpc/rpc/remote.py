"""The objects a session hands out: remote Function, KernelFunction, TimeEvaluator, Module and Tensor.

Each holds its session (for the conversion of values and for ``Device``) and the session's
:class:`~kernelrpc.rpc.channel.Channel`, and uses only the channel's public methods. They carry
the local runtime's names, so code runs unchanged locally or remotely. Dropping one frees its
handle on the server with the session's next request.
"""
from __future__ import annotations

import json
import math

from ..runtime.device import Device
from ..runtime.graph_executor import factory_for
from ..runtime.tensor import TensorLayout
from ..runtime.threads import check_num_threads
from ..wire.convert import PLAIN
from ..wire.protocol import encode_call
from ..wire.requests import CopyFrom, CopyTo, GetFunction, Op, TimeEvaluatorPacked
from ..wire.requests import TimeEvaluator as TimeEvaluatorRequest
from ..wire.values import DTYPE_BYTES, DeviceValue, FunctionHandle, ModuleHandle, TensorHandle


def byte_view(array) -> memoryview:
    """A flat byte view of a C-contiguous ndarray (also for zero-sized arrays, which cast refuses)."""
    import numpy as np

    return memoryview(array.reshape(-1).view(np.uint8))


class _Remote:
    __slots__ = ("_session", "_channel", "_handle", "__weakref__")

    def __del__(self) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None and getattr(self, "_session", None) is not None:
            channel.release(self._handle)


class Function(_Remote):
    """A function on the server (a global function, or one a call returned); call it like one.
    A module's functions are KernelFunctions."""

    __slots__ = ("name", "_id", "_to_wire", "_max_frame_bytes")

    def __init__(self, session, handle: FunctionHandle, name: str) -> None:
        self._session = session
        self._channel = session.channel
        self._handle = handle
        self._id = handle.id
        self._to_wire = session.all_to_wire
        self._max_frame_bytes = self._channel.max_frame_bytes
        self.name = name

    def __call__(self, *args):
        result = self._channel.call(encode_call(self._id, args, self._max_frame_bytes, self._to_wire))
        return result if type(result) in PLAIN else self._session.from_wire(result)

    def __repr__(self) -> str:
        return f"<remote Function {self.name} on {self._channel.address}>"


class KernelFunction(Function):
    """A function of a loaded module (a kernel), which keeps the CALL frame of its last call.

    When every argument of a call is a live remote tensor of this session, the encoded frame
    and the tensors' handles are kept (one frame a function, the last such call's, once it
    succeeded), and a call with the same live tensors again sends that frame without converting
    and encoding them. A frame is a function of the handles alone, so it is byte for byte what
    encoding them again would give. The check is by identity: each argument a remote Tensor
    whose session is this one (a freed tensor has none) and whose handle is the very object
    kept. Anything else takes the general path, which raises what it raised before; a call that
    fails drops the frame. (Global functions are called with plain values: ``echo(1)`` does not
    pay for the check.)
    """

    __slots__ = ("_kept",)

    def __init__(self, session, handle: FunctionHandle, name: str) -> None:
        super().__init__(session, handle, name)
        self._kept = None   # (frame, handles) of the last call with only tensors

    def __call__(self, *args):
        if args and args[0].__class__ is Tensor:  # ~20 ns less than type(); _call_tensors checks type()
            result = self._call_tensors(args)
            return result if type(result) in PLAIN else self._session.from_wire(result)
        return Function.__call__(self, *args)

    def _call_tensors(self, args):
        """A call whose first argument is a remote tensor: with the kept frame when it fits."""
        session, kept = self._session, self._kept
        if kept is not None and args[0]._handle is kept[1][0]:  # calls taking turns: ~0.2 us less
            frame, handles = kept
            if len(args) == len(handles):
                for arg, handle in zip(args, handles):
                    if type(arg) is not Tensor or arg._session is not session or arg._handle is not handle:
                        break
                else:
                    try:
                        return self._channel.call(frame)
                    except BaseException:
                        self._kept = None
                        raise
        handles = []
        for arg in args:
            if type(arg) is not Tensor or arg._session is not session:
                return self._channel.call(encode_call(self._id, args, self._max_frame_bytes, self._to_wire))
            handles.append(arg._handle)
        frame = encode_call(self._id, handles, self._max_frame_bytes)
        self._kept = None
        result = self._channel.call(frame)
        self._kept = frame, handles
        return result


class TimeEvaluator(KernelFunction):
    """The callable ``Module.time_evaluator`` returns: each call runs the timing on the device.

    With ``target`` (the module's, from its metadata) the device answers in the packed form
    (wire/profile.py, loaded with the first such result), else in JSON; the ProfileResult is the same either way.
    """

    __slots__ = ("_target",)

    def __init__(self, session, handle: FunctionHandle, name: str, target: dict | None = None) -> None:
        super().__init__(session, handle, name)
        self._target = target

    def __call__(self, *args):
        result = super().__call__(*args)
        if self._target is not None:
            from ..wire.profile import decode_profile

            return decode_profile(result, self._target, self.name)
        from ..runtime import ProfileResult

        return ProfileResult.from_dict(json.loads(result))


class Module(_Remote):
    """A module loaded on the server."""

    __slots__ = ("metadata",)

    def __init__(self, session, handle: ModuleHandle, metadata: dict | None) -> None:
        self._session = session
        self._channel = session.channel
        self._handle = handle
        self.metadata = metadata

    @property
    def entry_name(self) -> str | None:
        return (self.metadata or {}).get("entry")

    def get_function(self, name: str) -> KernelFunction:
        factory = factory_for(self, name)
        if factory is not None:       # a network module's graph executor (TVM's lib["default"])
            return factory
        (handle,) = self._channel.request(GetFunction(self._handle, name))
        return KernelFunction(self._session, handle, name)

    def __getitem__(self, name: str) -> KernelFunction:
        return self.get_function(name)

    def time_evaluator(self, name: str, dev: Device, number: int = 10, repeat: int = 1,
                       min_repeat_ms: float = 0, cooldown_interval_ms: float = 0,
                       repeats_to_cooldown: int = 1, f_preproc: str = "", *,
                       limit_zero_time_iterations: int = 100, cache_flush_bytes: int = 0) -> TimeEvaluator:
        """A callable that times ``name`` on the device (TVM semantics); returns a ProfileResult."""
        packed = self._channel.serves(Op.TIME_EVALUATOR_PACKED)
        request = (TimeEvaluatorPacked if packed else TimeEvaluatorRequest)(
            self._handle, name, DeviceValue(dev.device_type, dev.device_id), int(number), int(repeat),
            float(min_repeat_ms), float(cooldown_interval_ms), int(repeats_to_cooldown), f_preproc,
            int(limit_zero_time_iterations), int(cache_flush_bytes))
        (handle,) = self._channel.request(request)
        return TimeEvaluator(self._session, handle, name, self.target if packed else None)

    @property
    def target(self) -> dict:
        return (self.metadata or {}).get("target", {})

    @property
    def function_names(self) -> list[str]:
        return [f["name"] for f in (self.metadata or {}).get("functions", [])]

    @property
    def entry_func(self) -> KernelFunction:
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
                f"{' for ' + target if target else ''} on {self._channel.address}>")


class Tensor(_Remote, TensorLayout):
    """A tensor in the device's memory. ``numpy()`` and ``copyfrom()`` stream its bytes."""

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, session, handle: TensorHandle, device: Device | None = None) -> None:
        self._session = session
        self._channel = session.channel
        self._handle = handle
        self.shape = tuple(handle.shape)
        self.dtype = handle.dtype
        self.device = device or Device(handle.device.device_type, handle.device.device_id, session=session)

    @property
    def nbytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape)  # a handle's layout is checked already

    def _live(self):
        if self._session is None:
            raise ValueError("the tensor has been freed")
        return self._channel

    @property
    def freed(self) -> bool:
        return self._session is None

    def free(self) -> None:
        """Release the device memory now (otherwise it goes when this object is collected)."""
        session, self._session = self._session, None
        if session is not None:
            self._channel.free(self._handle)

    def copyfrom(self, source) -> "Tensor":
        """Fill from an ndarray (same shape; converted to this dtype), a local Tensor or a buffer."""
        view = self._source_view(source)
        self._live().request_with_raw(CopyTo(self._handle, 0, view.nbytes), view,
                                      lambda: f"copy to {self.dtype}{list(self.shape)}")
        return self

    def _source_view(self, source) -> memoryview:
        """The bytes of ``source`` to fill this tensor with, checked against its size."""
        if hasattr(source, "__array_interface__") or isinstance(source, (list, tuple)):
            view = byte_view(self._contiguous_array(source))
        elif hasattr(source, "buffer") and hasattr(source, "shape"):
            self._check_same_layout(source)
            view = source.buffer
        else:
            view = memoryview(source).cast("B")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyfrom: source has {view.nbytes} bytes, the tensor {self.nbytes}")
        return view

    def copyto_buffer(self, target) -> None:
        """Stream the tensor's bytes into a writable buffer of exactly ``nbytes``."""
        view = target if isinstance(target, memoryview) and target.format == "B" else \
            memoryview(target).cast("B")
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyto: target has {view.nbytes} bytes, the tensor {self.nbytes}")
        self._live().fetch(CopyFrom(self._handle, 0, view.nbytes), view, view.nbytes,
                           lambda: f"copy from {self.dtype}{list(self.shape)}")

    def numpy(self):
        import numpy as np

        array = np.empty(self.shape, dtype=self.dtype)
        self.copyto_buffer(byte_view(array))
        return array

    def copyto(self, target):
        """Copy into a local runtime Tensor or ndarray of the same layout, or onto a Device."""
        if isinstance(target, Device):
            if target.session is None:
                from ..runtime import Tensor as LocalTensor

                local = LocalTensor(self.shape, self.dtype, target)
                self.copyto_buffer(local.buffer)
                return local
            return target.session.array(self.numpy(), target)
        if hasattr(target, "buffer"):
            self.copyto_buffer(target.buffer)
        else:
            self.copyto_buffer(target)
        return target

    def __repr__(self) -> str:
        where = "freed" if self._session is None else f"on {self._channel.address}"
        return f"<remote Tensor {self.dtype}{list(self.shape)} {where}>"
