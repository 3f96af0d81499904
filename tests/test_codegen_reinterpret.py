"""``tir.reinterpret`` and ``tir.call_llvm_pure_intrin`` through the code generator (the int8
kernels' ``vpdpbusd`` is one): built for this host, run, checked against numpy."""
import numpy as np
import pytest

import kernelrpc as tvm
from kernelrpc import te, tir
from kernelrpc.compiler.expr import DTypeError


def run(x: np.ndarray, element, dtype: str, vectorize: bool = False) -> np.ndarray:
    """``out[i] = element(a[i])`` over ``x``, its loop in vectors of 16 with ``vectorize``."""
    a = te.placeholder(x.shape, name="a", dtype=str(x.dtype))
    out = te.compute(x.shape, lambda i: element(a[i]), name="out")
    s = te.create_schedule(out.op)
    if vectorize:
        s[out].vectorize(s[out].split(out.op.axis[0], factor=16)[1])
    result = tvm.nd.empty(x.shape, dtype)
    tvm.build(s, [a, out])(tvm.nd.array(x), result)
    return result.numpy()


def test_reinterpret_gives_the_bits_as_another_type():
    x = np.asarray([1.0, -2.5, np.inf, 0.0, 3e-38], np.float32)
    got = run(x, lambda v: tir.reinterpret("int32", v), "int32")
    np.testing.assert_array_equal(got, x.view(np.int32))


def test_reinterpret_in_a_vectorized_loop():
    x = np.arange(-16, 16, dtype=np.int32)
    got = run(x, lambda v: tir.reinterpret("float32", v), "float32", vectorize=True)
    np.testing.assert_array_equal(got.view(np.int32), x)


def test_an_llvm_intrinsic_by_name():
    x = np.asarray([0, 1, 0x0F0F0F0F, -1, 12345], np.int32)
    got = run(x, lambda v: tir.call_llvm_pure_intrin("int32", "llvm.bitreverse.i32", v), "int32")
    expected = [int(f"{v & 0xFFFFFFFF:032b}"[::-1], 2) for v in x.tolist()]
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(expected, np.uint32))


def test_refused_forms():
    with pytest.raises(DTypeError, match="widths differ"):
        tir.reinterpret("int8", te.const(1.0, "float32"))
    with pytest.raises(DTypeError, match="not the name of an LLVM intrinsic"):
        tir.call_llvm_pure_intrin("int32", "printf", te.const(1, "int32"))
