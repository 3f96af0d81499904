"""The element types a module, a tensor or a scalar argument may have (module format v1)."""
from __future__ import annotations

import operator
import struct
from dataclasses import dataclass

MAX_NDIM = 32


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    kind: str          # "b" bool, "i" signed, "u" unsigned, "f" float
    struct_char: str   # the struct module's format character

    def __str__(self) -> str:
        return self.name


#: each element type's struct format character: its size, standard (``"="``), is the type's
STRUCT_CHARS = {"bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B",
                "uint16": "H", "uint32": "I", "uint64": "Q", "float16": "e", "float32": "f",
                "float64": "d"}


def _kind(name: str) -> str:
    return "b" if name == "bool" else name[0] if name[0] in "uf" else "i"


DTYPES: dict[str, DType] = {name: DType(name, struct.calcsize("=" + char), _kind(name), char)
                            for name, char in STRUCT_CHARS.items()}

_ALIASES = {"bool_": "bool"}


def parse_dtype(value) -> DType:
    """A DType from a name (``"float32"``), a DType, a numpy dtype or a numpy scalar type."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        name = value
    elif isinstance(getattr(value, "name", None), str):        # numpy.dtype
        name = value.name
    elif isinstance(getattr(value, "__name__", None), str):    # numpy.float32, numpy.bool_
        name = value.__name__
    else:
        raise TypeError(f"dtype must be a name such as 'float32', got {type(value).__name__}")
    dtype = DTYPES.get(_ALIASES.get(name, name))
    if dtype is None:
        raise TypeError(f"unsupported dtype {name!r}; supported: {', '.join(DTYPES)}")
    return dtype


def pack_scalar(dtype: DType, value, where: str = "scalar") -> bytes:
    """Encode a Python scalar as ``dtype`` (native byte order), checking its type and range."""
    if dtype.kind == "f":
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise TypeError(f"{where}: expected a {dtype} number, got {type(value).__name__}")
        number = float(value)
        try:
            return struct.pack("=" + dtype.struct_char, number)
        except (OverflowError, struct.error):
            raise ValueError(f"{where}: {number!r} is out of range for {dtype}") from None
    if dtype.kind == "b":
        if type(value).__name__ in ("bool", "bool_"):   # numpy.bool_
            value = bool(value)
        if not isinstance(value, int) or value not in (0, 1):
            raise TypeError(f"{where}: expected a bool, got {value!r}")
        return struct.pack("=?", bool(value))
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: expected an integer for {dtype}, "
                        f"got {type(value).__name__}") from None
    bits = dtype.itemsize * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype.kind == "i" else (0, (1 << bits) - 1)
    if not lo <= number <= hi:
        raise ValueError(f"{where}: {number} is out of range for {dtype} [{lo}, {hi}]")
    return struct.pack("=" + dtype.struct_char, number)


def normalize_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        try:
            return normalize_shape((operator.index(shape),))
        except TypeError:
            raise TypeError(f"shape must be a sequence of integers, got {shape!r}") from None
    dims = tuple(shape)
    if len(dims) > MAX_NDIM:
        raise ValueError(f"shape has {len(dims)} dimensions; at most {MAX_NDIM} are supported")
    out = []
    for dim in dims:
        if isinstance(dim, bool):
            raise TypeError(f"shape entries must be integers, got {dim!r} in {dims}")
        try:
            dim = operator.index(dim)
        except TypeError:
            raise TypeError(f"shape entries must be integers, got {dim!r} in {dims}") from None
        if dim < 0:
            raise ValueError(f"shape entries must be non-negative, got {dim} in {dims}")
        out.append(dim)
    return tuple(out)
