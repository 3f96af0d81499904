"""Reductions and multi-output computes with TVM's names: te.comm_reducer (single and tuple,
argmax), te.sum(..., init=), te.compute returning a tuple; compiled and interpreted."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp

RNG = np.random.default_rng(7)


def _run_both(s, args, inputs, outputs):
    """Run compiled and interpreted; return both lists of output arrays."""
    dev = kernelrpc.cpu(0)
    module = kernelrpc.build(s, args, name="f")
    outs = [nd.empty(shape, dtype, dev) for shape, dtype in outputs]
    module(*[nd.array(a, dev) for a in inputs], *outs)
    ref = [np.zeros(shape, dtype) for shape, dtype in outputs]
    interp.run(te.lower(s, args), *inputs, *ref)
    return [o.numpy() for o in outs], ref


def _argmax_reducer():
    def fcombine(x, y):
        lhs = te.if_then_else(x[1] >= y[1], x[0], y[0])
        rhs = te.if_then_else(x[1] >= y[1], x[1], y[1])
        return lhs, rhs

    def fidentity(t0, t1):
        return te.const(-1, t0), te.min_value(t1)
    return te.comm_reducer(fcombine, fidentity, name="argmax")


@pytest.mark.parametrize("split", [False, True])
def test_tuple_reducer_argmax(split):
    m, n = 9, 23
    argmax = _argmax_reducer()
    idx = te.placeholder((m, n), name="idx", dtype="int32")
    val = te.placeholder((m, n), name="val", dtype="float32")
    k = te.reduce_axis((0, n), "k")
    T0, T1 = te.compute((m,), lambda i: argmax((idx[i, k], val[i, k]), axis=k), name="T")
    assert (T0.name, T1.name) == ("T.v0", "T.v1") and T0.op is T1.op
    s = te.create_schedule(T0.op)
    if split:
        ko, ki = s[T0].split(k, factor=4)
        s[T0].reorder(ko, ki, T0.op.axis[0])
    v = RNG.standard_normal((m, n)).astype("float32")
    ix = np.tile(np.arange(n, dtype="int32"), (m, 1))
    for got in _run_both(s, [idx, val, T0, T1], [ix, v], [((m,), "int32"), ((m,), "float32")]):
        np.testing.assert_array_equal(got[0], v.argmax(axis=1))
        np.testing.assert_array_equal(got[1], v.max(axis=1))


def test_custom_single_value_reducer():
    prod = te.comm_reducer(lambda x, y: x * y, lambda t: te.const(1, t), name="prod")
    A = te.placeholder((6, 5), name="A")
    k = te.reduce_axis((0, 5), "k")
    P = te.compute((6,), lambda i: prod(A[i, k], axis=k), name="P")
    s = te.create_schedule(P.op)
    a = (RNG.random((6, 5)) + 0.5).astype("float32")
    for (got,) in _run_both(s, [A, P], [a], [((6,), "float32")]):
        np.testing.assert_allclose(got, a.prod(axis=1), rtol=1e-5)


def test_sum_with_init():
    A = te.placeholder((7, 5), name="A")
    D = te.placeholder((7,), name="D")
    k = te.reduce_axis((0, 5), "k")
    C = te.compute((7,), lambda i: te.sum(A[i, k], axis=k, init=D[i] * 2.0), name="C")
    E = te.compute((7,), lambda i: te.max(A[i, k], axis=k, init=0.5), name="E")
    s = te.create_schedule([C.op, E.op])
    io, ii = s[C].split(C.op.axis[0], factor=3)
    a = RNG.standard_normal((7, 5)).astype("float32")
    d = RNG.standard_normal(7).astype("float32")
    for got_c, got_e in _run_both(s, [A, D, C, E], [a, d], [((7,), "float32")] * 2):
        np.testing.assert_allclose(got_c, 2 * d + a.sum(axis=1), rtol=1e-5)
        np.testing.assert_allclose(got_e, np.maximum(a.max(axis=1), 0.5), rtol=1e-6)


def test_multi_output_compute():
    A = te.placeholder((10, 12), name="A")
    S, D = te.compute((10, 12), lambda i, j: (A[i, j] + 1.0, A[i, j] * 2.0), name="SD")
    R = te.compute((10, 12), lambda i, j: S[i, j] - D[i, j], name="R")
    s = te.create_schedule(R.op)
    s[S].compute_at(s[R], R.op.axis[0])
    _, ji = s[R].split(R.op.axis[1], factor=4)
    s[R].vectorize(ji)
    a = RNG.standard_normal((10, 12)).astype("float32")
    for (got,) in _run_both(s, [A, R], [a], [((10, 12), "float32")]):
        np.testing.assert_allclose(got, (a + 1) - a * 2, rtol=1e-6)
    s2 = te.create_schedule(S.op)
    for got_s, got_d in _run_both(s2, [A, S, D], [a], [((10, 12), "float32")] * 2):
        np.testing.assert_allclose(got_s, a + 1)
        np.testing.assert_allclose(got_d, a * 2)


def test_mixed_reduction_and_plain_bodies_are_refused():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), "k")
    with pytest.raises(te.TensorError):
        te.compute((4,), lambda i: (te.sum(A[i, k], axis=k), A[i, 0]), name="bad")
