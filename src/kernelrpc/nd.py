"""Host-side tensor creation, the same call for local and remote devices (TVM's ``tvm.nd``).

``nd.array(np_array, dev)`` and ``nd.empty(shape, dtype, dev)`` allocate on ``dev``: locally as a
:class:`kernelrpc.runtime.Tensor`, or through ``dev.session`` when the device is remote.
"""
from __future__ import annotations

from .runtime import DTYPES, Device, Tensor, cpu, parse_dtype
from .runtime.dtype import normalize_shape

__all__ = ["Tensor", "array", "empty"]


def empty(shape, dtype="float32", device: Device | None = None):
    """A new tensor of ``shape`` and ``dtype`` on ``device`` (default: the local CPU)."""
    device = _device(device)
    shape = normalize_shape(shape)
    dtype = parse_dtype(dtype).name
    if device.session is not None:
        return device.session.empty(shape, dtype, device)
    return Tensor(shape, dtype, device)


def array(source, device: Device | None = None):
    """A new tensor on ``device`` holding a copy of ``source`` (an ndarray, or anything
    ``numpy.asarray`` accepts)."""
    import numpy as np  # here, not at import: ``nd.empty`` and a remote session need no numpy

    if isinstance(source, Tensor):
        source = source.numpy()
    array_ = np.asarray(source)
    try:
        dtype = parse_dtype(array_.dtype)
    except TypeError:
        raise TypeError(f"nd.array: numpy dtype {array_.dtype} has no kernelrpc equivalent; "
                        f"supported: {', '.join(DTYPES)}") from None
    contiguous = np.require(array_, requirements="C")   # ascontiguousarray makes 0-d 1-d
    device = _device(device)
    if device.session is not None:     # allocated and filled in one request where the server can
        return device.session.array(contiguous, device)
    tensor = empty(array_.shape, dtype, device)
    tensor.copyfrom(contiguous)
    return tensor


def _device(device) -> Device:
    if device is None:
        return cpu(0)
    if not isinstance(device, Device):
        raise TypeError(f"expected a kernelrpc Device (kernelrpc.cpu(0) or session.cpu(0)), "
                        f"got {type(device).__name__}")
    return device
