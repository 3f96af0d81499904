import struct

import numpy as np
import pytest

from kernelrpc.runtime.dtype import DTYPES, normalize_shape, pack_scalar, parse_dtype


def unpack_scalar(dtype, data):
    return struct.unpack("=" + dtype.struct_char, data)[0]


@pytest.mark.parametrize("name", list(DTYPES))
def test_dtype_table_matches_numpy(name):
    dtype = parse_dtype(name)
    assert dtype.itemsize == np.dtype(name).itemsize == struct.calcsize("=" + dtype.struct_char)
    assert parse_dtype(np.dtype(name)) is dtype
    assert parse_dtype(np.dtype(name).type) is dtype
    assert str(dtype) == name


@pytest.mark.parametrize("bad", ["float", "complex64", "bfloat16", "", np.dtype("complex128")])
def test_unsupported_dtypes_are_named(bad):
    with pytest.raises(TypeError, match="unsupported dtype"):
        parse_dtype(bad)


def test_non_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="dtype must be"):
        parse_dtype(3.5)


@pytest.mark.parametrize("name", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                  "uint64"])
def test_integer_scalars_round_trip_at_their_limits_and_refuse_beyond(name):
    info = np.iinfo(name)
    dtype = DTYPES[name]
    for value in (int(info.min), int(info.max), 0):
        assert unpack_scalar(dtype, pack_scalar(dtype, value)) == value
    for value in (int(info.min) - 1, int(info.max) + 1):
        with pytest.raises(ValueError, match=f"out of range for {name}"):
            pack_scalar(dtype, value, "f() argument 0 'n'")
    assert unpack_scalar(dtype, pack_scalar(dtype, np.int8(7))) == 7


@pytest.mark.parametrize("value", [1.5, "3", b"3", None])
def test_integer_scalars_refuse_non_integers(value):
    with pytest.raises(TypeError, match="expected an integer for int32"):
        pack_scalar(DTYPES["int32"], value)


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_float_scalars(name):
    dtype = DTYPES[name]
    for value in (0.5, -2.0, 3, np.float32(1.25), float("inf")):
        assert unpack_scalar(dtype, pack_scalar(dtype, value)) == float(value)
    too_big = float(np.finfo(name).max) * 4 if name != "float64" else None
    if too_big is not None:
        with pytest.raises(ValueError, match=f"out of range for {name}"):
            pack_scalar(dtype, too_big)
    with pytest.raises(TypeError, match=f"expected a {name} number"):
        pack_scalar(dtype, "1.0")


def test_bool_scalars():
    dtype = DTYPES["bool"]
    for value in (True, False, 1, 0, np.bool_(True)):
        assert unpack_scalar(dtype, pack_scalar(dtype, value)) is bool(value)
    for value in (2, -1, 0.0, "yes"):
        with pytest.raises(TypeError, match="expected a bool"):
            pack_scalar(dtype, value)


def test_shapes():
    assert normalize_shape((2, np.int64(3))) == (2, 3)
    assert normalize_shape(5) == (5,)
    assert normalize_shape([]) == ()
    with pytest.raises(ValueError, match="non-negative"):
        normalize_shape((2, -1))
    with pytest.raises(TypeError, match="integers"):
        normalize_shape((2, 1.5))
    with pytest.raises(TypeError, match="integers"):
        normalize_shape((True,))
    with pytest.raises(TypeError, match="sequence of integers"):
        normalize_shape("12")
    with pytest.raises(ValueError, match="at most 32"):
        normalize_shape((1,) * 33)
