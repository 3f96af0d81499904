"""te.extern with an IR builder body (TVM's tir.ir_builder), between compute stages."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp


def _cumsum(ins, outs):
    ib = te.ir_builder.create()
    a, c = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
    rows, cols = (d.value for d in ins[0].shape)
    with ib.for_range(0, rows, name="i", kind="parallel") as i:
        acc = ib.let("acc0", a[i, 0])
        c[i, 0] = acc
        with ib.for_range(1, cols, name="j") as j:
            c[i, j] = c[i, j - 1] + a[i, j]
    return ib.get()


def test_extern_between_computes():
    A = te.placeholder((5, 9), name="A")
    A2 = te.compute(A.shape, lambda i, j: A[i, j] * 2.0, name="A2")
    S = te.extern(A.shape, [A2], _cumsum, name="cumsum")
    B = te.compute(A.shape, lambda i, j: S[i, j] + 1.0, name="B")
    s = te.create_schedule(B.op)
    _, ji = s[B].split(B.op.axis[1], factor=4)
    s[B].vectorize(ji)
    a = np.random.default_rng(2).random((5, 9), dtype=np.float32)
    want = np.cumsum(2 * a, axis=1) + 1
    module = kernelrpc.build(s, [A, B], name="f")
    dev = kernelrpc.cpu(0)
    out = nd.empty((5, 9), "float32", dev)
    module(nd.array(a, dev), out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    ref = np.zeros((5, 9), "float32")
    interp.run(te.lower(s, [A, B]), a, ref)
    np.testing.assert_allclose(ref, want, rtol=1e-5)


def test_extern_output_as_argument_and_if_scope():
    def body(ins, outs):
        ib = te.ir_builder.create()
        x, y = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
        with ib.for_range(0, 8, name="i") as i:
            with ib.if_scope(x[i] > 0.5):
                y[i] = x[i]
            with ib.else_scope():
                y[i] = 0.0
        return ib.get()
    X = te.placeholder((8,), name="X")
    Y = te.extern((8,), [X], body, name="relu_ish")
    s = te.create_schedule(Y.op)
    x = np.linspace(0, 1, 8, dtype="float32")
    module = kernelrpc.build(s, [X, Y], name="g")
    dev = kernelrpc.cpu(0)
    out = nd.empty((8,), "float32", dev)
    module(nd.array(x, dev), out)
    np.testing.assert_array_equal(out.numpy(), np.where(x > 0.5, x, 0))
    with pytest.raises(te.ScheduleError, match="extern"):
        s[Y].split(Y.op.outputs[0].shape[0], factor=2)


def test_scan_cumulative_sum():
    """TVM's scan tutorial: s_state[t] = s_state[t - 1] + X[t], over a symbolic m too."""
    for m in (7, te.var("m")):
        n = 6
        X = te.placeholder((m, n), name="X")
        s_state = te.placeholder((m, n), name="s_state")
        s_init = te.compute((1, n), lambda _, i: X[0, i], name="s_init")
        s_update = te.compute((m, n), lambda t, i: s_state[t - 1, i] + X[t, i], name="s_update")
        s_scan = te.scan(s_init, s_update, s_state, inputs=[X])
        s = te.create_schedule(s_scan.op)
        module = kernelrpc.build(s, [X, s_scan], name="cumsum")
        dev = kernelrpc.cpu(0)
        for rows in ((7,) if isinstance(m, int) else (1, 7, 30)):
            x = np.random.default_rng(rows).random((rows, n), dtype=np.float32)
            out = nd.empty((rows, n), "float32", dev)
            module(nd.array(x, dev), out)
            np.testing.assert_allclose(out.numpy(), np.cumsum(x, axis=0), rtol=1e-5)
            if isinstance(m, int):
                ref = np.zeros((rows, n), "float32")
                interp.run(te.lower(s, [X, s_scan]), x, ref)
                np.testing.assert_allclose(ref, np.cumsum(x, axis=0), rtol=1e-5)


def test_scan_with_two_states_advancing_together():
    """A coupled recurrence: a[t] = b[t-1] + X[t], b[t] = a[t-1] * 0.5 + b[t-1]."""
    m, n = te.var("m"), 5
    X = te.placeholder((m, n), name="X")
    a_state = te.placeholder((m, n), name="a_state")
    b_state = te.placeholder((m, n), name="b_state")
    a_init = te.compute((1, n), lambda _, i: X[0, i], name="a_init")
    b_init = te.compute((1, n), lambda _, i: X[0, i] * 2.0, name="b_init")
    a_update = te.compute((m, n), lambda t, i: b_state[t - 1, i] + X[t, i], name="a_update")
    b_update = te.compute((m, n), lambda t, i: a_state[t - 1, i] * 0.5 + b_state[t - 1, i],
                          name="b_update")
    a_out, b_out = te.scan([a_init, b_init], [a_update, b_update], [a_state, b_state],
                           inputs=[X], name="pair")
    s = te.create_schedule(a_out.op)
    module = kernelrpc.build(s, [X, a_out, b_out], name="pair")
    dev = kernelrpc.cpu(0)
    for rows in (1, 2, 9):
        x = np.random.default_rng(rows).random((rows, n), dtype=np.float32)
        a_ref, b_ref = np.empty_like(x), np.empty_like(x)
        a_ref[0], b_ref[0] = x[0], x[0] * 2
        for t in range(1, rows):
            a_ref[t] = b_ref[t - 1] + x[t]
            b_ref[t] = a_ref[t - 1] * 0.5 + b_ref[t - 1]
        a, b = nd.empty((rows, n), "float32", dev), nd.empty((rows, n), "float32", dev)
        module(nd.array(x, dev), a, b)
        np.testing.assert_allclose(a.numpy(), a_ref, rtol=1e-5)
        np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-5)
    with pytest.raises(te.TensorError, match="one init and one update per state"):
        te.scan([a_init, b_init], [a_update], [a_state, b_state])
    short = te.compute((4, n), lambda t, i: b_state[t - 1, i], name="short")
    with pytest.raises(te.TensorError, match="same time extent"):
        te.scan([a_init, b_init], [a_update, short], [a_state, b_state])
