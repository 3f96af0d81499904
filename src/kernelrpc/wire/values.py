"""Sans-IO codec for the argument and result values of the session protocol.

A value list is ``u32 count`` followed by tagged values (``u8 tag`` + payload).
Every length and count is checked against the bytes actually present, nesting
is bounded, and dtypes and shapes are validated, so arbitrary bytes can only
raise :class:`~kernelrpc.errors.ProtocolError`.
"""
from __future__ import annotations

import math
import struct

from ..errors import ProtocolError
from ..runtime.dtype import DTYPES, MAX_NDIM

DTYPE_BYTES = {name: dtype.itemsize for name, dtype in DTYPES.items()}  # the runtime's table, by name
DEVICE_TYPES = ("cpu",)
MAX_DEPTH = 8
MAX_SHORT_TEXT = 255

T_NONE, T_FALSE, T_TRUE, T_INT, T_FLOAT, T_STR, T_BYTES, T_LIST = range(8)
T_DEVICE, T_TENSOR, T_MODULE, T_FUNCTION, T_TENSOR_HANDLE = range(8, 13)


class _Value:
    """A small value type of the wire: named fields, equal (and hashed) by type and fields.

    Treated as immutable. Not frozen dataclasses: one costs 0.6-0.8 us to build against ~0.2 us
    for these, and the decoder builds one per handle and device in every message.
    """

    __slots__ = ()
    _fields: tuple = ()

    def _key(self) -> tuple:
        return tuple([getattr(self, name) for name in self._fields])

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self), self._key()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"


class DeviceValue(_Value):
    __slots__ = _fields = ("device_type", "device_id")

    def __init__(self, device_type: str, device_id: int = 0) -> None:
        self.device_type = device_type
        self.device_id = device_id


class TensorValue(_Value):
    """A tensor sent inline with its data (small tensors as call arguments)."""

    __slots__ = _fields = ("dtype", "shape", "device", "data")

    def __init__(self, dtype: str, shape: tuple, device: DeviceValue, data: bytes) -> None:
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.data = data


class ModuleHandle(_Value):
    __slots__ = _fields = ("id",)

    def __init__(self, id: int) -> None:  # noqa: A002 (the field's name on the wire)
        self.id = id


class FunctionHandle(_Value):
    __slots__ = _fields = ("id",)

    def __init__(self, id: int) -> None:  # noqa: A002
        self.id = id


class TensorHandle(_Value):
    """A tensor that lives on the server; carries its layout so the client needs no round trip.

    ``wire`` is the handle's encoding, kept by the encoder (a tensor is sent with every copy and
    kernel call); it takes no part in equality.
    """

    __slots__ = ("id", "dtype", "shape", "device", "wire")
    _fields = ("id", "dtype", "shape", "device")

    def __init__(self, id: int, dtype: str, shape: tuple, device: DeviceValue,  # noqa: A002
                 wire: bytes | None = None) -> None:
        self.id = id
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.wire = wire


_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_TAG_I64 = struct.Struct("<Bq")
_TAG_F64 = struct.Struct("<Bd")
_TAG_U32 = struct.Struct("<BI")
_TAG_U64 = struct.Struct("<BQ")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_SMALL_COUNTS = tuple(_U32.pack(n) for n in range(16))
_NONE_BYTES, _FALSE_BYTES, _TRUE_BYTES = bytes([T_NONE]), bytes([T_FALSE]), bytes([T_TRUE])


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
    n = len(values)
    return (_SMALL_COUNTS[n] if n < len(_SMALL_COUNTS) else _U32.pack(n)) + encode_items(values)


def encode_items(values) -> bytes:
    """The tagged values without their count (the caller writes the count)."""
    parts = []
    for value in values:
        kind = type(value)
        if kind is int:  # the common argument, without a call per value
            try:
                parts.append(_TAG_I64.pack(T_INT, value))
            except struct.error:
                _enc_int(value, parts, 0)
            continue
        if kind is TensorHandle and value.wire is not None:  # a kernel call's, encoded before
            parts.append(value.wire)
            continue
        encoder = _ENCODERS.get(kind)
        if encoder is None:
            _encode_other(value, parts, 0)
        else:
            encoder(value, parts, 0)
    return b"".join(parts)


def _put_short_text(text: str, parts: list) -> None:
    raw = text.encode()
    if len(raw) > MAX_SHORT_TEXT:
        raise ProtocolError(f"name {text[:40]!r}... is longer than {MAX_SHORT_TEXT} bytes")
    parts.append(_U8.pack(len(raw)))
    parts.append(raw)


def _device(device: DeviceValue, parts: list) -> None:
    check_device(device)
    _put_short_text(device.device_type, parts)
    parts.append(_U32.pack(device.device_id))


def _layout(dtype: str, shape, device: DeviceValue, parts: list) -> None:
    check_layout(dtype, shape)
    _put_short_text(dtype, parts)
    parts.append(_U8.pack(len(shape)))
    parts.append(struct.pack(f"<{len(shape)}q", *shape))
    _device(device, parts)


def _enc_none(value, parts, depth):
    parts.append(_NONE_BYTES)


def _enc_bool(value, parts, depth):
    parts.append(_TRUE_BYTES if value else _FALSE_BYTES)


def _enc_int(value, parts, depth):
    try:
        parts.append(_TAG_I64.pack(T_INT, value))
    except struct.error:  # out of range: struct checks it for free
        raise ProtocolError(f"integer {value} does not fit in 64 bits") from None


def _enc_float(value, parts, depth):
    parts.append(_TAG_F64.pack(T_FLOAT, value))


def _enc_str(value, parts, depth):
    raw = value.encode("utf-8", "surrogatepass")
    parts.append(_TAG_U32.pack(T_STR, len(raw)))
    parts.append(raw)


def _enc_bytes(value, parts, depth):
    raw = memoryview(value).cast("B")
    parts.append(_TAG_U32.pack(T_BYTES, raw.nbytes))
    parts.append(raw)


def _enc_list(value, parts, depth):
    if depth >= MAX_DEPTH:
        raise ProtocolError(f"lists nest deeper than {MAX_DEPTH} levels")
    parts.append(_TAG_U32.pack(T_LIST, len(value)))
    for item in value:
        encoder = _ENCODERS.get(type(item))
        if encoder is None:
            _encode_other(item, parts, depth + 1)
        else:
            encoder(item, parts, depth + 1)


def _enc_device(value, parts, depth):
    parts.append(_U8.pack(T_DEVICE))
    _device(value, parts)


def _enc_tensor(value, parts, depth):
    if len(value.data) != nbytes_of(value.dtype, value.shape):
        raise ProtocolError("inline tensor data does not match its dtype and shape")
    parts.append(_U8.pack(T_TENSOR))
    _layout(value.dtype, value.shape, value.device, parts)
    parts.append(value.data)


def _enc_module(value, parts, depth):
    parts.append(_TAG_U64.pack(T_MODULE, value.id))


def _enc_function(value, parts, depth):
    parts.append(_TAG_U64.pack(T_FUNCTION, value.id))


def _enc_tensor_handle(value, parts, depth):
    wire = value.wire
    if wire is None:
        own = [_TAG_U64.pack(T_TENSOR_HANDLE, value.id)]
        _layout(value.dtype, value.shape, value.device, own)
        wire = b"".join(own)
        value.wire = wire
    parts.append(wire)


_ENCODERS = {
    type(None): _enc_none, bool: _enc_bool, int: _enc_int, float: _enc_float, str: _enc_str,
    bytes: _enc_bytes, bytearray: _enc_bytes, memoryview: _enc_bytes, list: _enc_list, tuple: _enc_list,
    DeviceValue: _enc_device, TensorValue: _enc_tensor, ModuleHandle: _enc_module,
    FunctionHandle: _enc_function, TensorHandle: _enc_tensor_handle,
}


def _encode_other(value, parts: list, depth: int) -> None:
    """Subclasses of the supported types (IntEnum, str subclasses, ...)."""
    for kind, encoder in _ENCODERS.items():
        if kind is not type(None) and isinstance(value, kind):
            encoder(bool(value) if kind is bool else value, parts, depth)
            return
    raise TypeError(f"cannot send a {type(value).__name__} over kernelrpc; supported: None, bool, "
                    "int, float, str, bytes, list, Device, Tensor, Module, Function")


# ---------------------------------------------------------------- decoding

# Decoders take (data, pos, depth) and return (value, new_pos). Reads past the end raise
# struct.error (turned into ProtocolError by decode_values); slices are checked explicitly.

def _take(data, pos: int, n: int) -> bytes:
    end = pos + n
    if end > len(data):
        raise ProtocolError(f"truncated message: needed {n} bytes at offset {pos}, "
                            f"only {len(data) - pos} left")
    return data[pos:end]


def _short_text(data, pos: int) -> tuple[str, int]:
    n = data[pos] if pos < len(data) else _truncated(pos)
    try:
        return str(_take(data, pos + 1, n), "utf-8"), pos + 1 + n
    except UnicodeDecodeError:
        raise ProtocolError("a name is not valid UTF-8") from None


def _truncated(pos: int):
    raise ProtocolError(f"truncated message at offset {pos}")


def decode_values(data, offset: int = 0) -> list:
    """Decode ``u32 count`` + values starting at ``offset``; the rest of the input must be consumed."""
    if type(data) is not bytes:
        data = bytes(data)
    try:
        (count,) = _U32.unpack_from(data, offset)
    except struct.error:
        raise ProtocolError(f"truncated message ({len(data)} bytes)") from None
    return decode_items(data, offset + 4, count)


def decode_items(data: bytes, pos: int, count: int) -> list:
    """Decode ``count`` tagged values from ``pos`` to the end of ``data`` (which must be consumed).

    Values that begin with a tensor handle (a kernel call's arguments, a copy's tensor and
    range) are looked up in a memo of such lists decoded before (``_LISTS``), as a whole.
    """
    key = None
    if pos < len(data) and data[pos] == T_TENSOR_HANDLE and len(data) - pos <= _MAX_LIST_MEMO_BYTES \
            and type(data) is bytes:
        key = data[pos:]
        hit = _LISTS.get(key)
        if hit is not None and hit[0] == count:
            return list(hit[1])
    try:
        values, pos = _read_items(data, pos, count, 0)
    except struct.error:
        raise ProtocolError(f"truncated message ({len(data)} bytes)") from None
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} unexpected bytes after the values")
    if key is not None and all(type(value) in _IMMUTABLE for value in values):
        if len(_LISTS) >= _MAX_LISTS_MEMO:
            _LISTS.clear()
        _LISTS[key] = count, tuple(values)
    return values


_LISTS: dict = {}
"""Value lists that begin with a tensor handle, decoded before: ``(count, values)`` by their
exact bytes. A session sends the same few tensors with every kernel call and copy, and the
decode of a list of handles (their memo keys found from their length bytes, one by one) was
~0.35 us a handle. As with ``_HANDLES``: only bytes that decoded and checked out are stored,
equal bytes decode to equal values, and a hit returns what the full decode would (a new list of
the same values, which are immutable: lists of any other values are not stored); bounded,
cleared when full; what the values refer to is looked up afterwards, as before."""
_MAX_LISTS_MEMO = 256
_MAX_LIST_MEMO_BYTES = 512


def decode_single(data: bytes):
    """Decode a value list that must hold exactly one value, and return that value."""
    if data[:4] != _SMALL_COUNTS[1]:
        raise ProtocolError(f"expected one value, got {len(decode_values(data))}")
    try:
        value, pos = _DECODERS[data[4]](data, 5, 0)
    except struct.error:
        raise ProtocolError(f"truncated message ({len(data)} bytes)") from None
    except IndexError:
        raise ProtocolError("truncated message or unknown value tag at offset 4") from None
    if pos != len(data):
        raise ProtocolError(f"{len(data) - pos} unexpected bytes after the values")
    return value


def _read_items(data, pos: int, count: int, depth: int) -> tuple[list, int]:
    if count > len(data) - pos:
        raise ProtocolError(f"value count {count} exceeds the {len(data) - pos} bytes left")
    out = []
    decoders = _DECODERS
    try:
        for _ in range(count):
            tag = data[pos]
            if tag == T_INT:  # the common argument, without a call per value
                out.append(_I64.unpack_from(data, pos + 1)[0])
                pos += 9
            else:
                value, pos = decoders[tag](data, pos + 1, depth)
                out.append(value)
    except IndexError:
        raise ProtocolError(f"truncated message or unknown value tag at offset {pos}") from None
    return out, pos


def _read_device(data, pos: int) -> tuple[DeviceValue, int]:
    device_type, pos = _short_text(data, pos)
    (device_id,) = _U32.unpack_from(data, pos)
    device = DeviceValue(device_type, device_id)
    check_device(device)
    return device, pos + 4


def _read_layout(data, pos: int):
    dtype, pos = _short_text(data, pos)
    ndim = data[pos] if pos < len(data) else _truncated(pos)
    if ndim > MAX_NDIM:
        raise ProtocolError(f"tensor has {ndim} dimensions, the limit is {MAX_NDIM}")
    shape = struct.unpack_from(f"<{ndim}q", data, pos + 1)
    check_layout(dtype, shape)
    device, pos = _read_device(data, pos + 1 + 8 * ndim)
    return dtype, shape, device, pos


def _dec_none(data, pos, depth):
    return None, pos


def _dec_false(data, pos, depth):
    return False, pos


def _dec_true(data, pos, depth):
    return True, pos


def _dec_int(data, pos, depth):
    return _I64.unpack_from(data, pos)[0], pos + 8


def _dec_float(data, pos, depth):
    return _F64.unpack_from(data, pos)[0], pos + 8


def _dec_str(data, pos, depth):
    (n,) = _U32.unpack_from(data, pos)
    try:
        return str(_take(data, pos + 4, n), "utf-8", "surrogatepass"), pos + 4 + n
    except UnicodeDecodeError:
        raise ProtocolError("a string value is not valid UTF-8") from None


def _dec_bytes(data, pos, depth):
    (n,) = _U32.unpack_from(data, pos)
    return bytes(_take(data, pos + 4, n)), pos + 4 + n


def _dec_list(data, pos, depth):
    if depth >= MAX_DEPTH:
        raise ProtocolError(f"lists nest deeper than {MAX_DEPTH} levels")
    (count,) = _U32.unpack_from(data, pos)
    return _read_items(data, pos + 4, count, depth + 1)


def _dec_device(data, pos, depth):
    return _read_device(data, pos)


def _dec_tensor(data, pos, depth):
    dtype, shape, device, pos = _read_layout(data, pos)
    n = DTYPE_BYTES[dtype] * math.prod(shape)
    return TensorValue(dtype, tuple(shape), device, bytes(_take(data, pos, n))), pos + n


def _dec_module(data, pos, depth):
    return ModuleHandle(_U64.unpack_from(data, pos)[0]), pos + 8


def _dec_function(data, pos, depth):
    return FunctionHandle(_U64.unpack_from(data, pos)[0]), pos + 8


def _dec_tensor_handle(data, pos, depth):
    # The end of the handle from its three length bytes (dtype, ndim, device type): a handle
    # whose bytes were decoded and checked before is taken from the memo (see _HANDLES).
    n = data[pos + 8]
    ndim = data[pos + 9 + n]
    end = pos + 15 + n + 8 * ndim + data[pos + 10 + n + 8 * ndim]
    wire = data[pos - 1:end] if type(data) is bytes else bytes(data[pos - 1:end])  # a key: hashable
    value = _HANDLES.get(wire)
    if value is not None:
        return value, end
    (handle,) = _U64.unpack_from(data, pos)
    dtype, shape, device, pos = _read_layout(data, pos + 8)
    value = TensorHandle(handle, dtype, tuple(shape), device, wire)
    if len(_HANDLES) >= _MAX_HANDLES_MEMO:
        _HANDLES.clear()
    _HANDLES[wire] = value
    return value, pos


_HANDLES: dict = {}
"""Tensor handles decoded before, by their exact bytes (tag included): a session sends the same
few handles with every kernel call and copy, and their decode and checks (the layout's text,
shape and device) were ~2 us each. Only bytes that decoded and checked out are stored, and
equal bytes decode to an equal handle, so a hit is what the full decode would return; a
handle freed meanwhile is refused where it is looked up, as before. Bounded: cleared when full."""
_MAX_HANDLES_MEMO = 1024


_IMMUTABLE = frozenset({int, float, bool, str, type(None), TensorHandle, FunctionHandle, ModuleHandle,
                        DeviceValue})  # the values a memoized list may hold

_DECODERS = (_dec_none, _dec_false, _dec_true, _dec_int, _dec_float, _dec_str, _dec_bytes, _dec_list,
             _dec_device, _dec_tensor, _dec_module, _dec_function, _dec_tensor_handle)
