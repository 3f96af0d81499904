"""Sans-IO codec for the argument and result values of the session protocol.

A value list is ``u32 count`` followed by tagged values (``u8 tag`` + payload).
Every length and count is checked against the bytes actually present, nesting
is bounded, and dtypes and shapes are validated, so arbitrary bytes can only
raise :class:`~kernelrpc.errors.ProtocolError`.
"""
from __future__ import annotations

import dataclasses
import math
import struct

from ..errors import ProtocolError

DTYPE_BYTES = {
    "bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "float16": 2, "float32": 4, "float64": 8,
}
DEVICE_TYPES = ("cpu",)
MAX_NDIM = 32
MAX_DEPTH = 8
MAX_SHORT_TEXT = 255

T_NONE, T_FALSE, T_TRUE, T_INT, T_FLOAT, T_STR, T_BYTES, T_LIST = range(8)
T_DEVICE, T_TENSOR, T_MODULE, T_FUNCTION, T_TENSOR_HANDLE = range(8, 13)


@dataclasses.dataclass(frozen=True)
class DeviceValue:
    device_type: str
    device_id: int = 0


@dataclasses.dataclass(frozen=True)
class TensorValue:
    """A tensor sent inline with its data (small tensors as call arguments)."""

    dtype: str
    shape: tuple[int, ...]
    device: DeviceValue
    data: bytes


@dataclasses.dataclass(frozen=True)
class ModuleHandle:
    id: int


@dataclasses.dataclass(frozen=True)
class FunctionHandle:
    id: int


@dataclasses.dataclass(frozen=True)
class TensorHandle:
    """A tensor that lives on the server; carries its layout so the client needs no round trip."""

    id: int
    dtype: str
    shape: tuple[int, ...]
    device: DeviceValue


_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_TAG_I64 = struct.Struct("<Bq")
_TAG_F64 = struct.Struct("<Bd")
_TAG_U32 = struct.Struct("<BI")
_TAG_U64 = struct.Struct("<BQ")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def nbytes_of(dtype: str, shape) -> int:
    """Size in bytes of a dense tensor; raises ProtocolError for an unknown dtype or bad shape."""
    check_layout(dtype, shape)
    return DTYPE_BYTES[dtype] * math.prod(shape)


def check_layout(dtype: str, shape) -> None:
    if dtype not in DTYPE_BYTES:
        raise ProtocolError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    if len(shape) > MAX_NDIM:
        raise ProtocolError(f"tensor has {len(shape)} dimensions, the limit is {MAX_NDIM}")
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0 or dim > _I64_MAX:
            raise ProtocolError(f"bad shape {tuple(shape)!r}: dimensions must be non-negative integers")


def check_device(device: DeviceValue) -> None:
    if device.device_type not in DEVICE_TYPES:
        raise ProtocolError(f"unsupported device type {device.device_type!r}; expected one of {DEVICE_TYPES}")
    if not 0 <= device.device_id < (1 << 31):
        raise ProtocolError(f"bad device id {device.device_id}")


# ---------------------------------------------------------------- encoding

def encode_values(values) -> bytes:
    """Encode a sequence of values as ``u32 count`` + tagged values."""
    parts = [_U32.pack(len(values))]
    for value in values:
        _encode(value, parts, 0)
    return b"".join(parts)


def _short_text(text: str, parts: list) -> None:
    raw = text.encode()
    if len(raw) > MAX_SHORT_TEXT:
        raise ProtocolError(f"name {text[:40]!r}... is longer than {MAX_SHORT_TEXT} bytes")
    parts.append(_U8.pack(len(raw)))
    parts.append(raw)


def _device(device: DeviceValue, parts: list) -> None:
    check_device(device)
    _short_text(device.device_type, parts)
    parts.append(_U32.pack(device.device_id))


def _layout(dtype: str, shape, device: DeviceValue, parts: list) -> None:
    check_layout(dtype, shape)
    _short_text(dtype, parts)
    parts.append(_U8.pack(len(shape)))
    parts.append(struct.pack(f"<{len(shape)}q", *shape))
    _device(device, parts)


def _encode(value, parts: list, depth: int) -> None:
    if value is None:
        parts.append(_U8.pack(T_NONE))
    elif value is True or value is False:
        parts.append(_U8.pack(T_TRUE if value else T_FALSE))
    elif isinstance(value, int):
        if not _I64_MIN <= value <= _I64_MAX:
            raise ProtocolError(f"integer {value} does not fit in 64 bits")
        parts.append(_TAG_I64.pack(T_INT, value))
    elif isinstance(value, float):
        parts.append(_TAG_F64.pack(T_FLOAT, value))
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        parts.append(_TAG_U32.pack(T_STR, len(raw)))
        parts.append(raw)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = memoryview(value).cast("B")
        parts.append(_TAG_U32.pack(T_BYTES, raw.nbytes))
        parts.append(raw)
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"lists nest deeper than {MAX_DEPTH} levels")
        parts.append(_TAG_U32.pack(T_LIST, len(value)))
        for item in value:
            _encode(item, parts, depth + 1)
    elif isinstance(value, DeviceValue):
        parts.append(_U8.pack(T_DEVICE))
        _device(value, parts)
    elif isinstance(value, TensorValue):
        if len(value.data) != nbytes_of(value.dtype, value.shape):
            raise ProtocolError("inline tensor data does not match its dtype and shape")
        parts.append(_U8.pack(T_TENSOR))
        _layout(value.dtype, value.shape, value.device, parts)
        parts.append(value.data)
    elif isinstance(value, ModuleHandle):
        parts.append(_TAG_U64.pack(T_MODULE, value.id))
    elif isinstance(value, FunctionHandle):
        parts.append(_TAG_U64.pack(T_FUNCTION, value.id))
    elif isinstance(value, TensorHandle):
        parts.append(_TAG_U64.pack(T_TENSOR_HANDLE, value.id))
        _layout(value.dtype, value.shape, value.device, parts)
    else:
        raise TypeError(f"cannot send a {type(value).__name__} over kernelrpc; supported: None, bool, "
                        "int, float, str, bytes, list, Device, Tensor, Module, Function")


# ---------------------------------------------------------------- decoding

class _Reader:
    __slots__ = ("view", "pos")

    def __init__(self, data) -> None:
        self.view = memoryview(data).cast("B")
        self.pos = 0

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.view):
            raise ProtocolError(f"truncated message: needed {n} bytes at offset {self.pos}, "
                                f"only {len(self.view) - self.pos} left")
        chunk = self.view[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct):
        return fmt.unpack(self.take(fmt.size))

    def remaining(self) -> int:
        return len(self.view) - self.pos

    def short_text(self) -> str:
        (n,) = self.unpack(_U8)
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("a name is not valid UTF-8") from None


def decode_values(data) -> list:
    """Decode ``u32 count`` + values; the whole input must be consumed."""
    reader = _Reader(data)
    values = read_values(reader)
    if reader.remaining():
        raise ProtocolError(f"{reader.remaining()} unexpected bytes after the values")
    return values


def read_values(reader: _Reader) -> list:
    (count,) = reader.unpack(_U32)
    if count > reader.remaining():
        raise ProtocolError(f"value count {count} exceeds the {reader.remaining()} bytes left")
    return [_decode(reader, 0) for _ in range(count)]


def _read_device(reader: _Reader) -> DeviceValue:
    device_type = reader.short_text()
    (device_id,) = reader.unpack(_U32)
    device = DeviceValue(device_type, device_id)
    check_device(device)
    return device


def _read_layout(reader: _Reader):
    dtype = reader.short_text()
    (ndim,) = reader.unpack(_U8)
    if ndim > MAX_NDIM:
        raise ProtocolError(f"tensor has {ndim} dimensions, the limit is {MAX_NDIM}")
    shape = struct.unpack(f"<{ndim}q", reader.take(8 * ndim))
    check_layout(dtype, shape)
    return dtype, shape, _read_device(reader)


def _decode(reader: _Reader, depth: int):
    (tag,) = reader.unpack(_U8)
    if tag == T_NONE:
        return None
    if tag == T_FALSE:
        return False
    if tag == T_TRUE:
        return True
    if tag == T_INT:
        return reader.unpack(_I64)[0]
    if tag == T_FLOAT:
        return reader.unpack(_F64)[0]
    if tag == T_STR:
        (n,) = reader.unpack(_U32)
        try:
            return str(reader.take(n), "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise ProtocolError("a string value is not valid UTF-8") from None
    if tag == T_BYTES:
        (n,) = reader.unpack(_U32)
        return bytes(reader.take(n))
    if tag == T_LIST:
        if depth >= MAX_DEPTH:
            raise ProtocolError(f"lists nest deeper than {MAX_DEPTH} levels")
        (count,) = reader.unpack(_U32)
        if count > reader.remaining():
            raise ProtocolError(f"list length {count} exceeds the {reader.remaining()} bytes left")
        return [_decode(reader, depth + 1) for _ in range(count)]
    if tag == T_DEVICE:
        return _read_device(reader)
    if tag == T_TENSOR:
        dtype, shape, device = _read_layout(reader)
        n = DTYPE_BYTES[dtype] * math.prod(shape)
        if n > reader.remaining():
            raise ProtocolError(f"inline tensor needs {n} bytes, only {reader.remaining()} left")
        return TensorValue(dtype, tuple(shape), device, bytes(reader.take(n)))
    if tag == T_MODULE:
        return ModuleHandle(reader.unpack(_U64)[0])
    if tag == T_FUNCTION:
        return FunctionHandle(reader.unpack(_U64)[0])
    if tag == T_TENSOR_HANDLE:
        (handle,) = reader.unpack(_U64)
        dtype, shape, device = _read_layout(reader)
        return TensorHandle(handle, dtype, tuple(shape), device)
    raise ProtocolError(f"unknown value tag {tag}")
