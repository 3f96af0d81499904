"""Tensors in local memory: dense, row-major, 64-byte aligned (docs/module-format.md)."""
from __future__ import annotations

import ctypes
import math
import sys

from .buffer import AlignedBuffer
from .device import Device, cpu
from .dtype import normalize_shape, parse_dtype


def _is_ndarray(value) -> bool:
    """Whether ``value`` is a numpy array, without importing numpy (a device may not have it)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


class TensorLayout:
    """What a local and a remote tensor share: the layout properties and ``copyfrom``'s checks.

    A subclass has ``shape`` (a tuple), ``dtype`` (its name) and ``numpy()``.
    """

    __slots__ = ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def asnumpy(self):
        return self.numpy()

    def _check_same_layout(self, source) -> None:
        """``source`` (a tensor) has this tensor's shape and dtype."""
        if tuple(source.shape) != self.shape or source.dtype != self.dtype:
            raise ValueError(f"copyfrom: source is {source.dtype}{list(source.shape)}, "
                             f"this tensor is {self.dtype}{list(self.shape)}")

    def _contiguous_array(self, source):
        """``source`` (an ndarray or nested lists of this shape) as a C-contiguous ndarray of this dtype."""
        import numpy as np

        array = np.asarray(source)
        if array.shape != self.shape:
            raise ValueError(f"copyfrom: array shape {array.shape} does not match "
                             f"tensor shape {self.shape}")
        return np.ascontiguousarray(array, dtype=self.dtype)


class Tensor(TensorLayout):
    """A local tensor; ``Tensor(shape, dtype)`` allocates zeroed memory on the local CPU."""

    def __init__(self, shape, dtype="float32", device: Device | None = None):
        device = cpu(0) if device is None else device
        if not isinstance(device, Device) or not device.is_local:
            raise ValueError(f"a local Tensor needs a local device, got {device!r}")
        self.shape: tuple[int, ...] = normalize_shape(shape)
        self._dtype = parse_dtype(dtype)
        self.device = device
        self.nbytes = math.prod(self.shape) * self._dtype.itemsize
        self._buf = AlignedBuffer(self.nbytes)

    @property
    def dtype(self) -> str:
        return self._dtype.name

    @property
    def data(self) -> int:
        """The address of the first element (64-byte aligned)."""
        return self._buf.address

    @property
    def buffer(self) -> memoryview:
        """A writable byte view of the whole tensor, e.g. for ``socket.recv_into`` (no copy)."""
        return self._buf.view

    @property
    def freed(self) -> bool:
        return self._buf.freed

    def free(self) -> None:
        """Release the memory now; later use of this tensor raises ValueError."""
        self._buf.free()

    def copyfrom(self, source) -> Tensor:
        """Fill this tensor from an ndarray (same shape; converted to this dtype if needed), a
        list, another Tensor of the same shape and dtype, or any buffer of exactly ``nbytes``."""
        if isinstance(source, Tensor):
            self._check_same_layout(source)
            self.buffer[:] = source.buffer
            return self
        if isinstance(source, (list, tuple)) or _is_ndarray(source):
            self._copy_from_array(source)
            return self
        try:
            view = memoryview(source)
        except TypeError:
            if callable(getattr(source, "numpy", None)):   # a remote tensor
                self._copy_from_array(source.numpy())
                return self
            raise TypeError(f"copyfrom: expected an ndarray, a Tensor or a buffer, "
                            f"got {type(source).__name__}") from None
        with view:
            self._copy_from_buffer(view)
        return self

    def _copy_from_buffer(self, view: memoryview) -> None:
        if view.nbytes != self.nbytes:
            raise ValueError(f"copyfrom: source has {view.nbytes} bytes, this tensor "
                             f"{self.dtype}{list(self.shape)} has {self.nbytes}")
        if not view.c_contiguous:
            raise ValueError("copyfrom: source buffer must be C-contiguous")
        try:
            flat = view.cast("B")
        except TypeError:       # a format with an explicit byte order, such as "<f"
            flat = memoryview(view.tobytes())
        self.buffer[:] = flat

    def _copy_from_array(self, source) -> None:
        array = self._contiguous_array(source)
        if self.nbytes:
            ctypes.memmove(self.data, array.ctypes.data, self.nbytes)

    def numpy(self):
        """A new numpy array holding a copy of the data."""
        import numpy as np

        array = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            ctypes.memmove(array.ctypes.data, self.data, self.nbytes)
        return array

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def copyto(self, target):
        """Copy into ``target``: a Tensor of the same shape and dtype, or a Device (local or
        remote), on which a new tensor is allocated. Returns the target tensor."""
        if isinstance(target, Device):
            if target.session is None:
                return Tensor(self.shape, self.dtype, target).copyfrom(self)
            dest = target.session.empty(self.shape, self.dtype, target)
            dest.copyfrom(self.buffer)
            return dest
        if isinstance(target, Tensor):
            return target.copyfrom(self)
        if hasattr(target, "copyfrom"):
            target.copyfrom(self.buffer)
            return target
        raise TypeError(f"copyto: expected a Tensor or a Device, got {type(target).__name__}")

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return f"<Tensor {self.dtype}{list(self.shape)} on {self.device!r}{state}>"


def empty(shape, dtype="float32", device: Device | None = None) -> Tensor:
    """A new zero-filled local tensor."""
    return Tensor(shape, dtype, device)
