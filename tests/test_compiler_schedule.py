"""Schedule primitives with TVM's names: cache_read, rfactor, pragma (auto_unroll_max_step,
unroll_explicit), normalize; compiled and interpreted against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp, ir

RNG = np.random.default_rng(11)


def _run_both(s, args, inputs, out_shape):
    dev = kernelrpc.cpu(0)
    module = kernelrpc.build(s, args, name="f")
    out = nd.empty(out_shape, "float32", dev)
    module(*[nd.array(a, dev) for a in inputs], out)
    ref = np.zeros(out_shape, "float32")
    func = te.lower(s, args)
    interp.run(func, *inputs, ref)
    return out.numpy(), ref, func


def _loops(func):
    found = []
    ir.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, ir.For) else None)
    return found


def _gemm(M, K, N):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, C


def test_cache_read_with_compute_at():
    M, K, N = 12, 10, 20
    A, B, C = _gemm(M, K, N)
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "local", [C])
    assert AA.name == "A.local"
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 8)
    s[AA].compute_at(s[C], jo)
    a = RNG.standard_normal((M, K)).astype("float32")
    b = RNG.standard_normal((K, N)).astype("float32")
    got, ref, func = _run_both(s, [A, B, C], [a, b], (M, N))
    assert "A.local" in str(func)
    allocs = []
    ir.post_order_visit(func.body, lambda n: allocs.append(n) if isinstance(n, ir.Allocate)
                        else None)
    # the j.outer tail (20 = 2*8 + 4) is partitioned into its own loop, with its own copy
    assert {a_.buffer.size for a_ in allocs if a_.buffer.name == "A.local"} == {4 * K}
    for out in (got, ref):
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_cache_read_refuses_a_non_reader():
    A, B, C = _gemm(4, 4, 4)
    D = te.compute((4, 4), lambda i, j: A[i, j] + 1.0, name="D")
    s = te.create_schedule([C.op, D.op])
    with pytest.raises(te.ScheduleError, match="does not read"):
        s.cache_read(B, "local", [D])


@pytest.mark.parametrize("which", ["inner", "outer"])
@pytest.mark.parametrize("n", [64, 61])
def test_rfactor(which, n):
    A = te.placeholder((7, n), name="A")
    k = te.reduce_axis((0, n), "k")
    B = te.compute((7,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(B.op.reduce_axis[0], factor=16)
    BF = s.rfactor(B, ki if which == "inner" else ko)
    assert BF.name == "B.rf" and BF.shape[0].value == (16 if which == "inner" else 4)
    if which == "inner":
        s[BF].vectorize(BF.op.axis[0])
    a = RNG.standard_normal((7, n)).astype("float32")
    got, ref, _ = _run_both(s, [A, B], [a], (7,))
    for out in (got, ref):
        np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_rfactor_of_a_root_axis_with_factor_axis():
    A = te.placeholder((5, 9), name="A")
    k = te.reduce_axis((0, 9), "k")
    B = te.compute((5,), lambda i: te.max(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    BF = s.rfactor(B, B.op.reduce_axis[0], factor_axis=1)
    assert [d.value for d in BF.shape] == [5, 9]
    a = RNG.standard_normal((5, 9)).astype("float32")
    got, ref, _ = _run_both(s, [A, B], [a], (5,))
    for out in (got, ref):
        np.testing.assert_array_equal(out, a.max(axis=1))


def test_rfactor_refuses_a_data_axis():
    A, B, C = _gemm(4, 4, 4)
    s = te.create_schedule(C.op)
    with pytest.raises(te.ScheduleError):
        s.rfactor(C, C.op.axis[0])


def test_pragma_auto_unroll_max_step():
    A = te.placeholder((8, 16), name="A")
    B = te.compute((8, 16), lambda i, j: A[i, j] * 2.0, name="B")
    s = te.create_schedule(B.op)
    jo, ji = s[B].split(B.op.axis[1], factor=4)
    s[B].pragma(B.op.axis[0], "auto_unroll_max_step", 4)
    a = RNG.standard_normal((8, 16)).astype("float32")
    got, ref, func = _run_both(s, [A, B], [a], (8, 16))
    assert {lp.var.name for lp in _loops(func)} == {"i", "j.outer"}   # j.inner (4) unrolled
    for out in (got, ref):
        np.testing.assert_allclose(out, a * 2)
    s[B].pragma(B.op.axis[0], "unroll_explicit", False)
    assert {lp.var.name for lp in _loops(te.lower(s, [A, B]))} == {"i", "j.outer", "j.inner"}
    with pytest.raises(te.ScheduleError, match="not supported"):
        s[B].pragma(B.op.axis[0], "no_such_pragma")


def test_normalize_returns_the_schedule():
    A, B, C = _gemm(4, 4, 4)
    s = te.create_schedule(C.op)
    assert s.normalize() is s


def test_storage_align_pads_the_row_stride():
    M, K, N = 8, 10, 12
    A, B, C = _gemm(M, K, N)
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "local", [C])
    s[AA].storage_align(AA.op.axis[0], 16, 3)
    a = RNG.standard_normal((M, K)).astype("float32")
    b = RNG.standard_normal((K, N)).astype("float32")
    got, ref, func = _run_both(s, [A, B, C], [a, b], (M, N))
    allocs = []
    ir.post_order_visit(func.body, lambda n: allocs.append(n) if isinstance(n, ir.Allocate)
                        else None)
    (buf,) = [x.buffer for x in allocs if x.buffer.name == "A.local"]
    assert buf.strides == (19, 1) and buf.size == 8 * 19       # 10 -> 19 = 16 + 3
    for out in (got, ref):
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    s[C].storage_align(C.op.axis[0], 16, 0)
    with pytest.raises(te.LowerError, match="function argument"):
        te.lower(s, [A, B, C])


def test_prefetch_emits_hints_and_keeps_results():
    M, K, N = 16, 64, 32
    A, B, C = _gemm(M, K, N)
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].prefetch(A, i, 1)
    a = RNG.standard_normal((M, K)).astype("float32")
    b = RNG.standard_normal((K, N)).astype("float32")
    got, ref, func = _run_both(s, [A, B, C], [a, b], (M, N))
    text = str(func)
    assert "prefetch(A[" in text and "A.line" in text       # 64 floats = 4 lines per row
    for out in (got, ref):
        np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    module = kernelrpc.build(s, [A, B, C], name="f")
    assert "llvm.prefetch" in module.get_source("ll")
    with pytest.raises(te.ScheduleError, match="does not read"):
        s[C].prefetch(C, i, 1)
