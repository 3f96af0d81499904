"""Between one side's objects and the wire values of values.py: the conversion the client and the
server share.

Plain values (None, bool, int, float, str, bytes) travel as they are and lists element by
element; a Device travels as a DeviceValue. What the other objects become is each side's own
business: the client sends its remote objects as their handles and local arrays by value, the
server keeps its runtime objects in a handle table and sends new handles. Each side subclasses
:class:`Converter` with those two hooks.
"""
from __future__ import annotations

from ..runtime.device import Device
from .values import DeviceValue, TensorValue

PLAIN = frozenset({int, float, str, bytes, bool, type(None)})
"""Types that are their own wire value (exact types: subclasses go through the encoder's check)."""


class Converter:
    """Objects to wire values (``to_wire``) and back (``from_wire``), recursing into lists."""

    def object_to_wire(self, value):
        """A value that is not plain, not a list and not a Device, as a wire value."""
        return value

    def object_from_wire(self, value):
        """A wire value that is not plain, not a list and not a DeviceValue, as an object."""
        return value

    def device_from_wire(self, value: DeviceValue) -> Device:
        return Device(value.device_type, value.device_id)

    def to_wire(self, value):
        if type(value) in PLAIN:
            return value
        if isinstance(value, (list, tuple)):
            return [self.to_wire(v) for v in value]
        if isinstance(value, Device):
            return DeviceValue(value.device_type, value.device_id)
        return self.object_to_wire(value)

    def from_wire(self, value):
        if type(value) in PLAIN:
            return value
        if isinstance(value, list):
            return [self.from_wire(v) for v in value]
        if isinstance(value, DeviceValue):
            return self.device_from_wire(value)
        return self.object_from_wire(value)

    def all_to_wire(self, values):
        """``values`` as wire values; the same sequence when all of them are plain (the common case)."""
        for value in values:
            if type(value) not in PLAIN:
                return [self.to_wire(v) for v in values]
        return values

    def all_from_wire(self, values):
        for value in values:
            if type(value) not in PLAIN:
                return [self.from_wire(v) for v in values]
        return values


def tensor_value(value) -> TensorValue:
    """A local array (anything numpy accepts) or runtime Tensor, sent by value."""
    device = DeviceValue("cpu", 0)
    if type(value).__name__ == "Tensor" and hasattr(value, "buffer"):
        return TensorValue(value.dtype, tuple(value.shape), device, bytes(value.buffer))
    import numpy as np

    array = np.ascontiguousarray(value)
    return TensorValue(array.dtype.name, tuple(array.shape), device, array.tobytes())


def local_tensor(value: TensorValue):
    """A runtime Tensor holding a copy of a tensor sent by value."""
    from ..runtime.tensor import Tensor

    tensor = Tensor(value.shape, value.dtype, Device(value.device.device_type, value.device.device_id))
    tensor.buffer[:] = value.data
    return tensor
