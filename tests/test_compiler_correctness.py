"""Never a silent wrong answer: unsigned and wrapping integer arithmetic, out-of-bounds
indexing (at build time and, with ``tir.instrument_bound_checkers``, at run time),
indices past 32 bits, compute_at cycles, zero-size and 0-d tensors."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp
from kernelrpc.errors import KernelError

import te_workloads as W

INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _build_and_run(s, args, inputs, out_shape, out_dtype):
    module = kernelrpc.build(s, args, name="f")
    dev = kernelrpc.cpu(0)
    out = nd.empty(out_shape, out_dtype, dev)
    module(*[nd.array(a, dev) for a in inputs], out)
    return out.numpy()


def _interp(s, args, inputs, out_shape, out_dtype):
    out = np.zeros(out_shape, out_dtype)
    with np.errstate(all="ignore"):
        interp.run(te.lower(s, args), *inputs, out)
    return out


@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("runner", [_interp, _build_and_run])
def test_integer_comparisons_follow_the_dtype(dtype, runner):
    info = np.iinfo(dtype)
    values = np.array([info.min, info.min + 1, 0, 1, 7, info.max // 2, info.max - 1, info.max],
                      dtype)
    x = np.repeat(values, len(values)).astype(dtype)
    z = np.tile(values, len(values)).astype(dtype)
    n = len(x)
    X = te.placeholder((n,), name="X", dtype=dtype)
    Z = te.placeholder((n,), name="Z", dtype=dtype)
    ops = [lambda a, b: a < b, lambda a, b: a <= b, lambda a, b: a > b, lambda a, b: a >= b]
    Y = te.compute((n, 4), lambda i, k: te.if_then_else(
        k == 0, (X[i] < Z[i]).astype(dtype), te.if_then_else(
            k == 1, (X[i] <= Z[i]).astype(dtype), te.if_then_else(
                k == 2, (X[i] > Z[i]).astype(dtype), (X[i] >= Z[i]).astype(dtype)))), name="Y")
    s = te.create_schedule(Y.op)
    got = runner(s, [X, Z, Y], [x, z], (n, 4), dtype)
    want = np.stack([op(x, z) for op in ops], axis=1).astype(dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32"])
@pytest.mark.parametrize("runner", [_interp, _build_and_run])
def test_comparison_after_wrapping_addition(dtype, runner):
    """``x + 100 < 50`` must not become ``x < -50``: the addition wraps."""
    info = np.iinfo(dtype)
    x = np.array([info.min, -1 if info.min < 0 else 3, 0, 20, info.max - 99, info.max],
                 dtype)
    X = te.placeholder((len(x),), name="X", dtype=dtype)
    Y = te.compute(X.shape, lambda i: te.if_then_else(X[i] + 100 < 50, X[i] - X[i] + 1,
                                                     X[i] - X[i]), name="Y")
    s = te.create_schedule(Y.op)
    got = runner(s, [X, Y], [x], x.shape, dtype)
    with np.errstate(all="ignore"):
        want = ((x + np.asarray(100, dtype)) < 50).astype(dtype)
    np.testing.assert_array_equal(got, want)


def test_unsigned_lowering_keeps_the_comparison():
    X = te.placeholder((8,), name="X", dtype="uint32")
    Z = te.placeholder((8,), name="Z", dtype="uint32")
    Y = te.compute((8,), lambda i: te.if_then_else(X[i] < Z[i], X[i], Z[i]), name="Y")
    text = str(te.lower(te.create_schedule(Y.op), [X, Z, Y]))
    assert "(X[i] < Z[i])" in text


def test_literal_too_big_for_the_dtype_promotes_like_tvm():
    i = te.var("i")
    assert (i + 2 ** 32).dtype == "int64"
    x = te.var("x", "uint8")
    assert (x + 300).dtype == "int32"
    with pytest.raises(TypeError, match="uint8"):
        te.const(300, "uint8")


# --------------------------------------------------------------------------- bounds

def test_provably_out_of_bounds_read_is_a_build_error():
    A = te.placeholder((4, 4), name="A")
    B = te.compute((4, 4), lambda i, j: A[i, j + 1], name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(te.LowerError, match=r"A\[i, \(j \+ 1\)\].*\[1, 4\].*\[0, 4\)"):
        te.lower(s, [A, B])


def test_far_out_of_bounds_read_is_a_build_error_not_a_segfault():
    A = te.placeholder((4, 4), name="A")
    B = te.compute((4, 4), lambda i, j: A[i * 100000, j], name="B")
    with pytest.raises(te.LowerError, match="A"):
        kernelrpc.build(te.create_schedule(B.op), [A, B])


def test_index_past_32_bits_does_not_wrap():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i + 2 ** 32], name="B")
    with pytest.raises(te.LowerError, match="A"):
        te.lower(te.create_schedule(B.op), [A, B])


def test_out_of_bounds_write_is_a_build_error():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i], name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=3)   # guarded: fine
    te.lower(s, [A, B])
    C = te.compute((8,), lambda i: A[7 - i] + A[i], name="C")
    te.lower(te.create_schedule(C.op), [A, C])


def _gather():
    A = te.placeholder((10,), name="A")
    idx = te.placeholder((4,), name="idx", dtype="int32")
    B = te.compute((4,), lambda i: A[idx[i]], name="B")
    return A, idx, B


def test_data_dependent_index_is_checked_at_run_time_when_asked():
    A, idx, B = _gather()
    s = te.create_schedule(B.op)
    a = np.arange(10, dtype="float32")
    with te.PassContext(config={"tir.instrument_bound_checkers": True}):
        module = kernelrpc.build(s, [A, idx, B], name="gather")
        func = te.lower(s, [A, idx, B])
    dev = kernelrpc.cpu(0)
    out = nd.empty((4,), "float32", dev)
    module(nd.array(a, dev), nd.array(np.array([0, 3, 9, 2], "int32"), dev), out)
    np.testing.assert_array_equal(out.numpy(), [0, 3, 9, 2])
    for bad in ([0, 1, 10, 2], [0, -1, 2, 3], [2 ** 31 - 1, 0, 0, 0]):
        with pytest.raises(KernelError) as info:
            module(nd.array(a, dev), nd.array(np.array(bad, "int32"), dev), out)
        assert info.value.code == 3
        assert "out of bounds" in str(info.value)
        with pytest.raises(interp.IROutOfBounds):
            interp.run(func, a, np.array(bad, "int32"), np.zeros(4, "float32"))


def test_bound_checks_on_vector_and_parallel_code():
    A = te.placeholder((64,), name="A")
    idx = te.placeholder((64,), name="idx", dtype="int32")
    B = te.compute((64,), lambda i: A[idx[i]] * 2.0, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=16)
    s[B].vectorize(xi)
    s[B].parallel(xo)
    with te.PassContext(config={"tir.instrument_bound_checkers": True}):
        module = kernelrpc.build(s, [A, idx, B], name="vgather")
        func = te.lower(s, [A, idx, B])
    assert "all_lanes(" in str(func) and "B[ramp(" in str(func)    # still vector code
    dev = kernelrpc.cpu(0)
    a = np.arange(64, dtype="float32")
    good = np.arange(64, dtype="int32")[::-1].copy()
    out = nd.empty((64,), "float32", dev)
    module(nd.array(a, dev), nd.array(good, dev), out)
    np.testing.assert_array_equal(out.numpy(), a[good] * 2)
    bad = good.copy()
    bad[40] = 64
    with pytest.raises(KernelError):
        module(nd.array(a, dev), nd.array(bad, dev), out)
    with pytest.raises(interp.IROutOfBounds):
        interp.run(func, a, bad, np.zeros(64, "float32"))


# --------------------------------------------------------------------------- schedules, shapes

def test_mutual_compute_at_is_a_schedule_error():
    _, B, C = W.chain()
    s = te.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(te.ScheduleError, match="cycle"):
        s[C].compute_at(s[B], B.op.axis[0])


def test_zero_size_tensor_builds_and_runs():
    A = te.placeholder((0, 5), name="A")
    B = te.compute((0, 5), lambda i, j: A[i, j] + 1, name="B")
    s = te.create_schedule(B.op)
    got = _build_and_run(s, [A, B], [np.zeros((0, 5), "float32")], (0, 5), "float32")
    assert got.shape == (0, 5)


def test_zero_d_array():
    t = nd.array(np.array(3.0))
    assert t.shape == ()
    assert t.numpy() == 3.0
    assert t.numpy().shape == ()


def test_bound_checks_never_fire_on_correct_schedules():
    M, K, N = 19, 13, 37
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 16)
    s[CC].compute_at(s[C], no)
    s[C].vectorize(ni)
    s[C].parallel(mo)
    with te.PassContext(config={"tir.instrument_bound_checkers": True}):
        module = kernelrpc.build(s, [A, B, C], name="gemm")
        func = te.lower(s, [A, B, C])
    with te.PassContext(opt_level=1, config={"tir.instrument_bound_checkers": True}):
        unpartitioned = te.lower(s, [A, B, C])
    # without loop partitioning the guarded tails keep checks; partitioned loops prove them
    assert "assert(" in str(unpartitioned)
    rng = np.random.default_rng(5)
    a = rng.random((M, K), dtype=np.float32)
    b = rng.random((K, N), dtype=np.float32)
    got = _build_and_run(s, [A, B, C], [a, b], (M, N), "float32")
    dev = kernelrpc.cpu(0)
    out = nd.empty((M, N), "float32", dev)
    module(nd.array(a, dev), nd.array(b, dev), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5)
    for f in (func, unpartitioned):
        c = np.zeros((M, N), "float32")
        interp.run(f, a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-5)


def test_bound_checks_respect_if_then_else_padding():
    """An inlined padding stage reads out of range only where if_then_else rules it out."""
    data, kernel, padded, out = W.conv2d_nchw(1, 3, 6, 7, 4, 3, 3, 1, 1)
    s = te.create_schedule(out.op)
    s[padded].compute_inline()
    with te.PassContext(config={"tir.instrument_bound_checkers": True}):
        func = te.lower(s, [data, kernel, out])
        module = kernelrpc.build(s, [data, kernel, out], name="conv")
    rng = np.random.default_rng(3)
    d = rng.random((1, 3, 6, 7), dtype=np.float32)
    k = rng.random((4, 3, 3, 3), dtype=np.float32)
    dp = np.pad(d, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 4, 6, 7), "float32")
    for y in range(6):
        for x in range(7):
            want[0, :, y, x] = np.einsum("cij,fcij->f", dp[0, :, y:y + 3, x:x + 3], k)
    got = np.zeros_like(want)
    interp.run(func, d, k, got)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    dev = kernelrpc.cpu(0)
    o = nd.empty(want.shape, "float32", dev)
    module(nd.array(d, dev), nd.array(k, dev), o)
    np.testing.assert_allclose(o.numpy(), want, rtol=1e-5)


def test_packed_layout_read_past_its_extent_is_a_build_error():
    """The GEMM tutorial's packing with N // bn blocks reads past packedB when bn does not
    divide N: that was a silent wrong answer (or a segfault); now the build says so."""
    M, K, N, bn = 8, 5, 40, 16
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), "k")
    packedB = te.compute((N // bn, K, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * packedB[n // bn, k, n % bn], axis=k),
                   name="C")
    with pytest.raises(te.LowerError, match=r"packedB.*\[0, 2\], outside the extent \[0, 2\)"):
        kernelrpc.build(te.create_schedule(C.op), [A, B, C])


def test_integer_division_by_a_constant_zero_is_a_build_error():
    X = te.placeholder((4,), name="X", dtype="int32")
    Y = te.compute((4,), lambda i: te.truncdiv(X[i], te.const(0, "int32")), name="Y")
    with pytest.raises(Exception, match="division by zero"):
        kernelrpc.build(te.create_schedule(Y.op), [X, Y])
    # a division the condition rules out is never generated
    Z = te.compute((4,), lambda i: te.if_then_else(te.const(0) != 0, X[i] // 0, X[i]), name="Z")
    got = _build_and_run(te.create_schedule(Z.op), [X, Z], [np.arange(4, dtype="int32")],
                         (4,), "int32")
    np.testing.assert_array_equal(got, np.arange(4))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(c0=st.integers(-6, 6), c1=st.integers(-3, 3), c2=st.integers(-6, 6),
       floor=st.booleans())
def test_static_bound_check_matches_the_interpreter(c0, c1, c2, floor):
    """For unguarded affine (and floordiv) indices the build refuses exactly the kernels
    whose accesses leave the tensor: an unchecked build run by the interpreter, which checks
    every access, agrees."""
    A = te.placeholder((6, 8), name="A")

    def index(i, j):
        second = j * c1 + c2
        return i + c0, (te.floordiv(second, 2) if floor else second)
    B = te.compute((4, 5), lambda i, j: A[index(i, j)], name="B")
    s = te.create_schedule(B.op)
    from kernelrpc.compiler.lower import bounds
    try:
        bounds.check_static_bounds(B.op)
        refused = False
    except te.LowerError:
        refused = True
    from kernelrpc.compiler.lower.schedule_ops import ScheduleLowering
    func = ScheduleLowering(s, [A, B]).run("f")            # no check: see what happens
    try:
        interp.run(func, np.zeros((6, 8), "float32"), np.zeros((4, 5), "float32"))
        out_of_bounds = False
    except interp.IROutOfBounds:
        out_of_bounds = True
    # per-dimension check: a dimension out of range may still land inside the flat buffer
    i_range = range(c0, 4 + c0)
    js = [j * c1 + c2 for j in range(5)]
    js = [j // 2 for j in js] if floor else js
    dim_oob = min(i_range) < 0 or max(i_range) >= 6 or min(js) < 0 or max(js) >= 8
    assert refused == dim_oob
    if out_of_bounds:
        assert refused
