"""End to end: kernelrpc.te schedules -> build -> native code run through kernelrpc.runtime,
checked against numpy (GEMM, batch matmul, broadcast add, reductions, softmax, conv2d)."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te

import te_workloads as W

RNG = np.random.default_rng(1234)


def run(module, *arrays, out_shapes, out_dtype="float32"):
    """Call the entry function with ``arrays`` as inputs and fresh outputs; return outputs."""
    dev = kernelrpc.cpu(0)
    inputs = [nd.array(a, dev) for a in arrays]
    outputs = [nd.empty(shape, out_dtype, dev) for shape in out_shapes]
    module(*inputs, *outputs)
    return [o.numpy() for o in outputs]


def rand(*shape, dtype="float32"):
    return RNG.random(shape, dtype=np.float64).astype(dtype)


@pytest.mark.parametrize("M,K,N", [(64, 64, 64), (37, 29, 53)])
def test_gemm_tiled_vectorized_parallel_with_tails(M, K, N):
    A, B, C = W.gemm(M, N, K)
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], 8, 16)
    (k,) = s[C].op.reduce_axis
    ko, ki = s[C].split(k, factor=4)
    s[C].reorder(mo, no, ko, mi, ki, ni)
    s[C].vectorize(ni)
    s[C].parallel(mo)
    module = kernelrpc.build(s, [A, B, C], name="gemm")
    a, b = rand(M, K), rand(K, N)
    (c,) = run(module, a, b, out_shapes=[(M, N)])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mc", [None, 8])
def test_gemm_register_blocked_with_packing_odd_shape(mc):
    """The register-blocked recipe on a shape that leaves tails everywhere (``mc=8``: in row
    blocks, the last one short)."""
    M, K, N = 23, 19, 40
    s, (A, B, C) = W.microkernel(M, N, K, mr=4, nr=16, mc=mc)
    module = kernelrpc.build(s, [A, B, C], name="gemm")
    a, b = rand(M, K), rand(K, N)
    (c,) = run(module, a, b, out_shapes=[(M, N)])
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    assert "alloca" in module.get_source("ll")


def test_batch_matmul_float64():
    Bt, M, K, N = 3, 9, 7, 5
    X = te.placeholder((Bt, M, K), name="X", dtype="float64")
    Y = te.placeholder((Bt, K, N), name="Y", dtype="float64")
    k = te.reduce_axis((0, K), "k")
    Z = te.compute((Bt, M, N), lambda b, i, j: te.sum(X[b, i, k] * Y[b, k, j], axis=k), name="Z")
    s = te.create_schedule(Z.op)
    s[Z].parallel(Z.op.axis[0])
    module = kernelrpc.build(s, [X, Y, Z], name="bmm")
    x, y = rand(Bt, M, K, dtype="float64"), rand(Bt, K, N, dtype="float64")
    (z,) = run(module, x, y, out_shapes=[(Bt, M, N)], out_dtype="float64")
    np.testing.assert_allclose(z, x @ y, rtol=1e-12)


def test_broadcast_add_vectorized_with_tail():
    n, m = 13, 37
    A = te.placeholder((n, m), name="A")
    b = te.placeholder((m,), name="b")
    C = te.compute((n, m), lambda i, j: A[i, j] + b[j], name="C")
    s = te.create_schedule(C.op)
    jo, ji = s[C].split(C.op.axis[1], factor=16)
    s[C].vectorize(ji)
    s[C].parallel(C.op.axis[0])
    module = kernelrpc.build(s, [A, b, C], name="badd")
    a, bb = rand(n, m), rand(m)
    (c,) = run(module, a, bb, out_shapes=[(n, m)])
    np.testing.assert_array_equal(c, a + bb)


def test_row_reductions_sum_max_min():
    n, m = 11, 45
    A = te.placeholder((n, m), name="A")
    k1, k2, k3 = (te.reduce_axis((0, m), name) for name in ("k1", "k2", "k3"))
    S = te.compute((n,), lambda i: te.sum(A[i, k1], axis=k1), name="S")
    X = te.compute((n,), lambda i: te.max(A[i, k2], axis=k2), name="X")
    N_ = te.compute((n,), lambda i: te.min(A[i, k3], axis=k3), name="N")
    s = te.create_schedule([S.op, X.op, N_.op])
    module = kernelrpc.build(s, [A, S, X, N_], name="rows")
    a = rand(n, m) - 0.5
    sums, maxes, mins = run(module, a, out_shapes=[(n,)] * 3)
    np.testing.assert_allclose(sums, a.sum(axis=1), rtol=1e-5)
    np.testing.assert_array_equal(maxes, a.max(axis=1))
    np.testing.assert_array_equal(mins, a.min(axis=1))


def test_softmax():
    n, m = 7, 33
    X = te.placeholder((n, m), name="X")
    k1, k2 = te.reduce_axis((0, m), "k1"), te.reduce_axis((0, m), "k2")
    mx = te.compute((n,), lambda i: te.max(X[i, k1], axis=k1), name="mx")
    ex = te.compute((n, m), lambda i, j: te.exp(X[i, j] - mx[i]), name="ex")
    sm = te.compute((n,), lambda i: te.sum(ex[i, k2], axis=k2), name="sm")
    Y = te.compute((n, m), lambda i, j: ex[i, j] / sm[i], name="Y")
    s = te.create_schedule(Y.op)
    s[Y].parallel(Y.op.axis[0])
    module = kernelrpc.build(s, [X, Y], name="softmax")
    x = (rand(n, m) - 0.5) * 20
    (y,) = run(module, x, out_shapes=[(n, m)])
    np.testing.assert_allclose(y, W.softmax_reference(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("stride,pad", [(1, 1), (2, 0)])
def test_conv2d_nchw_direct(stride, pad):
    data, kernel, padded, out = W.conv2d_nchw(1, 3, 11, 13, 4, 3, 3, pad, stride)
    s = te.create_schedule(out.op)
    s[padded].compute_inline()
    n, f, y, x = s[out].op.axis
    s[out].parallel(f)
    xo, xi = s[out].split(x, factor=8)
    s[out].vectorize(xi)
    module = kernelrpc.build(s, [data, kernel, out], name="conv")
    d, w = rand(1, 3, 11, 13), rand(4, 3, 3, 3)
    expect = W.conv2d_reference(d, w, stride, pad)
    (o,) = run(module, d, w, out_shapes=[expect.shape])
    np.testing.assert_allclose(o, expect, rtol=1e-5, atol=1e-5)


def test_integer_matmul_uint8_by_int8_into_int32():
    M, K, N = 9, 21, 35
    A = te.placeholder((M, K), name="A", dtype="uint8")
    B = te.placeholder((K, N), name="B", dtype="int8")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k].astype("int32") * B[k, j].astype("int32"),
                                               axis=k), name="C")
    s = te.create_schedule(C.op)
    jo, ji = s[C].split(C.op.axis[1], factor=16)
    s[C].reorder(C.op.axis[0], jo, s[C].op.reduce_axis[0], ji)
    s[C].vectorize(ji)
    module = kernelrpc.build(s, [A, B, C], name="qmm")
    a = RNG.integers(0, 256, (M, K), dtype=np.uint8)
    b = RNG.integers(-128, 128, (K, N), dtype=np.int8)
    (c,) = run(module, a, b, out_shapes=[(M, N)], out_dtype="int32")
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))
