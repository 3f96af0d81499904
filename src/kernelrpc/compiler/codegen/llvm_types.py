"""Dtype strings -> LLVM IR type and constant spellings."""
from __future__ import annotations

import math
import struct

from ..expr import dtype_element, dtype_lanes, parse_dtype

_FLOAT_TYPES = {16: "half", 32: "float", 64: "double"}


def scalar_type(dtype: str) -> str:
    """LLVM type of one element in registers (``bool`` is ``i1``)."""
    code, bits, _ = parse_dtype(dtype)
    if code == "float":
        return _FLOAT_TYPES[bits]
    return f"i{bits}"


def llvm_type(dtype: str) -> str:
    lanes = dtype_lanes(dtype)
    elem = scalar_type(dtype_element(dtype))
    return elem if lanes == 1 else f"<{lanes} x {elem}>"


def memory_type(dtype: str) -> str:
    """LLVM type of one element in memory (``bool`` is stored as ``i8``)."""
    return "i8" if parse_dtype(dtype)[0] == "bool" else scalar_type(dtype)


def element_bytes(dtype: str) -> int:
    code, bits, _ = parse_dtype(dtype)
    return 1 if code == "bool" else bits // 8


def is_signed(dtype: str) -> bool:
    return parse_dtype(dtype)[0] == "int"


def float_literal(value: float, dtype: str) -> str:
    """An exact LLVM spelling: hex of the double (float/double) or ``0xH`` (half)."""
    bits = parse_dtype(dtype)[1]
    if bits == 16:
        return "0xH%04X" % struct.unpack("<H", struct.pack("<e", value))[0]
    if bits == 32 and math.isfinite(value):
        value = struct.unpack("<f", struct.pack("<f", value))[0]
    elif bits == 32:
        value = float(value)
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]


def int_literal(value: int, dtype: str) -> str:
    code, bits, _ = parse_dtype(dtype)
    if code == "bool":
        return "true" if value else "false"
    value &= (1 << bits) - 1
    if value >= 1 << (bits - 1):
        value -= 1 << bits
    return str(value)
