"""Lowered IR run by the reference interpreter, checked against numpy."""
import numpy as np
import pytest

from kernelrpc import te
from kernelrpc.compiler import interp

import te_workloads as W

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def run(s, args, *arrays):
    interp.run(te.lower(s, args), *arrays)


def check_gemm(s, args, M, N, K):
    a, b = rand(M, K), rand(K, N)
    c = np.full((M, N), np.nan, "float32")
    run(s, args, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("step", W.TUTORIAL_STEPS)
def test_tutorial_steps_square(step):
    s, args = W.tutorial_step(step, 32, 32, 32, bn=8, kfactor=4)
    check_gemm(s, args, 32, 32, 32)


@pytest.mark.parametrize("step", W.TUTORIAL_STEPS)
@pytest.mark.parametrize("shape", [(13, 19, 11), (9, 8, 7)])
def test_tutorial_steps_odd_shapes(step, shape):
    M, N, K = shape
    s, args = W.tutorial_step(step, M, N, K, bn=8, kfactor=3)
    check_gemm(s, args, M, N, K)


@pytest.mark.parametrize("pack_per_panel", [False, True])
@pytest.mark.parametrize("shape", [(8, 32, 16), (7, 40, 5), (1, 17, 3)])
def test_register_blocked_microkernel(shape, pack_per_panel):
    M, N, K = shape
    s, args = W.microkernel(M, N, K, mr=2, nr=16, lanes=8, pack_per_panel=pack_per_panel)
    check_gemm(s, args, M, N, K)


@pytest.mark.parametrize("mc", [4, 6, 5])
def test_register_blocked_row_blocks(mc):
    """Blocks of rows that divide the tiles, leave a short last block, or are not whole tiles."""
    M, N, K = 19, 40, 7
    s, args = W.microkernel(M, N, K, mr=2, nr=16, lanes=8, mc=mc)
    check_gemm(s, args, M, N, K)


def test_batch_matmul():
    A, B, C = W.batch_matmul(3, 5, 6, 7)
    s = te.create_schedule(C.op)
    b, i, j = C.op.axis
    jo, ji = s[C].split(j, factor=4)
    s[C].vectorize(ji)
    s[C].parallel(b)
    a, bb = rand(3, 5, 7), rand(3, 7, 6)
    c = np.zeros((3, 5, 6), "float32")
    run(s, [A, B, C], a, bb, c)
    np.testing.assert_allclose(c, a @ bb, rtol=1e-5, atol=1e-5)


def test_broadcast_add_fused_and_vectorized():
    A, B, C = W.broadcast_add(3, 4, 10)
    s = te.create_schedule(C.op)
    i, j, l = C.op.axis
    ij = s[C].fuse(i, j)
    s[C].parallel(ij)
    lo, li = s[C].split(l, factor=4)
    s[C].vectorize(li)
    a, b = rand(3, 1, 10), rand(1, 4, 10)
    c = np.zeros((3, 4, 10), "float32")
    run(s, [A, B, C], a, b, c)
    np.testing.assert_array_equal(c, a + b)


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
def test_row_reduction(kind):
    A, R = W.row_reduce(5, 13, kind)
    s = te.create_schedule(R.op)
    (k,) = R.op.reduce_axis
    ko, ki = s[R].split(k, factor=4)
    s[R].unroll(ki)
    a = rand(5, 13)
    r = np.zeros(5, "float32")
    run(s, [A, R], a, r)
    np.testing.assert_allclose(r, getattr(a, kind)(axis=1), rtol=1e-5)


def test_softmax_multi_stage_with_compute_at():
    A, mx, ex, sm, out = W.softmax(6, 10)
    s = te.create_schedule(out.op)
    i, j = out.op.axis
    s[mx].compute_at(s[out], i)
    s[sm].compute_at(s[out], i)
    s[ex].compute_at(s[out], i)
    jo, ji = s[out].split(j, factor=4)
    s[out].vectorize(ji)
    f = te.lower(s, [A, out])
    a = rand(6, 10)
    o = np.zeros((6, 10), "float32")
    interp.run(f, a, o)
    np.testing.assert_allclose(o, W.softmax_reference(a), rtol=1e-5, atol=1e-6)
    text = str(f)
    assert "allocate(maxelem" in text and "[1]" in text


def test_softmax_inline_exp():
    A, mx, ex, sm, out = W.softmax(4, 9)
    s = te.create_schedule(out.op)
    s[ex].compute_inline()
    a = rand(4, 9)
    o = np.zeros((4, 9), "float32")
    run(s, [A, out], a, o)
    np.testing.assert_allclose(o, W.softmax_reference(a), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pad,stride", [(1, 1), (0, 2)])
def test_conv2d_nchw(pad, stride):
    data, kernel, padded, out = W.conv2d_nchw(1, 3, 7, 6, 4, 3, 3, pad, stride)
    s = te.create_schedule(out.op)
    s[padded].compute_inline()
    b, fo, y, x = out.op.axis
    xo, xi = s[out].split(x, factor=4)
    s[out].vectorize(xi)
    s[out].parallel(fo)
    d, k = rand(1, 3, 7, 6), rand(4, 3, 3, 3)
    o = np.zeros(out.shape and tuple(int(e.value) for e in out.shape), "float32")
    run(s, [data, kernel, out], d, k, o)
    np.testing.assert_allclose(o, W.conv2d_reference(d, k, stride, pad), rtol=1e-4, atol=1e-4)


def test_conv2d_padding_stage_computed_at_output_rows():
    data, kernel, padded, out = W.conv2d_nchw(1, 2, 5, 5, 2, 3, 3, 1, 1)
    s = te.create_schedule(out.op)
    b, fo, y, x = out.op.axis
    s[padded].compute_at(s[out], y)
    d, k = rand(1, 2, 5, 5), rand(2, 2, 3, 3)
    o = np.zeros((1, 2, 5, 5), "float32")
    f = te.lower(s, [data, kernel, out])
    interp.run(f, d, k, o)
    np.testing.assert_allclose(o, W.conv2d_reference(d, k, 1, 1), rtol=1e-4, atol=1e-4)
    assert "allocate(pad: Pointer(global float32), float32, [1, 2, 3, 7])" in str(f)


def test_symbolic_shape_becomes_scalar_parameter():
    n = te.var("n")
    A = te.placeholder((n, 4), name="A")
    B = te.compute((n, 4), lambda i, j: A[i, j] * 2.0, name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=3)
    f = te.lower(s, [A, B])
    assert [p.name for p in f.params] == ["A", "B", "n"]
    a = rand(7, 4)
    b = np.zeros((7, 4), "float32")
    interp.run(f, a, b, 7)
    np.testing.assert_array_equal(b, a * 2)


def test_math_casts_and_integer_division():
    A = te.placeholder((12,), name="A", dtype="int32")
    B = te.compute((12,), lambda i: te.floordiv(A[i], 3) + te.floormod(A[i], 5)
                   + te.truncdiv(A[i], 4) + te.truncmod(A[i], 4), name="B")
    F = te.compute((12,), lambda i: te.sqrt(te.abs(A[i].astype("float32"))) + te.tanh(1.0 * i),
                   name="F")
    s = te.create_schedule([B.op, F.op])
    a = np.arange(-6, 6, dtype="int32")
    b = np.zeros(12, "int32")
    fo = np.zeros(12, "float32")
    run(s, [A, B, F], a, b, fo)
    trunc_div = np.trunc(a / 4).astype("int32")
    np.testing.assert_array_equal(b, a // 3 + a % 5 + trunc_div + (a - 4 * trunc_div))
    np.testing.assert_allclose(fo, np.sqrt(np.abs(a)) + np.tanh(np.arange(12.0)), rtol=1e-6)


def test_interpreter_catches_out_of_bounds():
    from kernelrpc.compiler.expr import const
    from kernelrpc.compiler.ir import Buffer, PrimFunc, Store
    buf = Buffer("X", (4,), "float32")
    f = PrimFunc("oob", [buf], Store(buf, const(1.0), const(4)))
    with pytest.raises(interp.IROutOfBounds):
        interp.run(f, np.zeros(4, "float32"))


def test_reduction_with_where_and_nonzero_axis_start():
    A = te.placeholder((4, 9), name="A")
    k = te.reduce_axis((2, 9), "k")
    R = te.compute((4,), lambda i: te.sum(A[i, k], axis=k, where=A[i, k] > 0), name="R")
    s = te.create_schedule(R.op)
    ko, ki = s[R].split(k, factor=2)
    a = rand(4, 9)
    r = np.zeros(4, "float32")
    run(s, [A, R], a, r)
    np.testing.assert_allclose(r, np.where(a[:, 2:] > 0, a[:, 2:], 0).sum(axis=1), rtol=1e-5)


def test_column_max_vectorized_over_the_data_axis():
    A = te.placeholder((7, 20), name="A", dtype="int32")
    k = te.reduce_axis((0, 7), "k")
    R = te.compute((20,), lambda j: te.max(A[k, j], axis=k), name="R")
    s = te.create_schedule(R.op)
    jo, ji = s[R].split(R.op.axis[0], factor=8)
    s[R].reorder(jo, k, ji)
    s[R].vectorize(ji)
    a = RNG.integers(-100, 100, (7, 20)).astype("int32")
    r = np.zeros(20, "int32")
    run(s, [A, R], a, r)
    np.testing.assert_array_equal(r, a.max(axis=0))
