"""TVM's math intrinsics: compiled (scalar and vectorized) and interpreted, against numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp

N = 37          # not a multiple of the vector width: the tail runs too

UNARY = {
    "erf": (te.erf, np.vectorize(math.erf)),
    "log1p": (te.log1p, np.log1p),
    "exp10": (te.exp10, lambda x: np.power(10.0, x)),
    "tan": (te.tan, np.tan),
    "asin": (te.asin, np.arcsin),
    "acos": (te.acos, np.arccos),
    "atan": (te.atan, np.arctan),
    "sinh": (te.sinh, np.sinh),
    "cosh": (te.cosh, np.cosh),
    "nearbyint": (te.nearbyint, np.rint),
}
BINARY = {
    "atan2": (te.atan2, np.arctan2),
    "hypot": (te.hypot, np.hypot),
    "copysign": (te.copysign, np.copysign),
    "fmod": (te.fmod, np.fmod),
    "div": (te.div, np.divide),
}


def _schedules(out):
    plain = te.create_schedule(out.op)
    vector = te.create_schedule(out.op)
    _, inner = vector[out].split(out.op.axis[0], factor=8)
    vector[out].vectorize(inner)
    return {"scalar": plain, "vector": vector}


def _check(args, inputs, want, out_dtype, rtol, kind):
    out = args[-1]
    s = _schedules(out)[kind]
    func = te.lower(s, args)
    if kind == "vector":
        assert "ramp(" in str(func), str(func)       # the loop did vectorize
    module = kernelrpc.build(s, args, name="f")
    dev = kernelrpc.cpu(0)
    got = nd.empty(out.shape and tuple(int(d.value) for d in out.shape), out_dtype, dev)
    module(*[nd.array(a, dev) for a in inputs], got)
    ref = np.zeros(got.shape, out_dtype)
    interp.run(func, *inputs, ref)
    for result in (got.numpy(), ref):
        if out_dtype == "bool" or "int" in out_dtype:
            np.testing.assert_array_equal(result, want)
        else:
            np.testing.assert_allclose(result, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype, kind):
    fn, ref = UNARY[name]
    x = np.linspace(-0.95, 0.95, N).astype(dtype)
    X = te.placeholder((N,), name="X", dtype=dtype)
    Y = te.compute((N,), lambda i: fn(X[i]), name="Y")
    _check([X, Y], [x], ref(x.astype("float64")), dtype, 2e-6 if dtype == "float32" else 1e-12,
           kind)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, kind):
    fn, ref = BINARY[name]
    x = np.linspace(-3, 3, N).astype("float32")
    y = np.linspace(2.5, -1.7, N).astype("float32")
    X = te.placeholder((N,), name="X")
    Y = te.placeholder((N,), name="Y")
    Z = te.compute((N,), lambda i: fn(X[i], Y[i]), name="Z")
    _check([X, Y, Z], [x, y], ref(x, y), "float32", 2e-6, kind)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_ldexp(kind):
    x = np.linspace(-3, 3, N).astype("float32")
    e = (np.arange(N) % 9 - 4).astype("int32")
    X = te.placeholder((N,), name="X")
    E = te.placeholder((N,), name="E", dtype="int32")
    Y = te.compute((N,), lambda i: te.ldexp(X[i], E[i]), name="Y")
    _check([X, E, Y], [x, e], np.ldexp(x, e), "float32", 0, kind)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite"])
def test_float_predicates(name, kind):
    x = np.resize(np.array([0.0, np.nan, np.inf, -np.inf, -1.5, 3e38], "float32"), N)
    X = te.placeholder((N,), name="X")
    Y = te.compute((N,), lambda i: getattr(te, name)(X[i]), name="Y")
    _check([X, Y], [x], getattr(np, name)(x), "bool", 0, kind)


def test_predicates_on_integers_are_constants():
    assert te.isnan(te.var("i")).value == 0
    assert te.isfinite(te.var("i")).value == 1


@pytest.mark.parametrize("kind", ["scalar", "vector"])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64"])
def test_clz_and_popcount(dtype, kind):
    info = np.iinfo(dtype)
    x = np.resize(np.array([0, 1, 2, 3, info.max, info.min, 100, 12345 % info.max], dtype), N)
    bits = info.bits
    X = te.placeholder((N,), name="X", dtype=dtype)
    Y = te.compute((N, 2), lambda i, k: te.if_then_else(k == 0, te.clz(X[i]), te.popcount(X[i])),
                   name="Y")
    unsigned = x.view(f"uint{bits}")
    want = np.stack([[bits - int(v).bit_length() for v in unsigned],
                     np.bitwise_count(unsigned)], axis=1).astype(dtype)
    s = te.create_schedule(Y.op)
    if kind == "vector":
        s[Y].reorder(Y.op.axis[1], Y.op.axis[0])
        _, inner = s[Y].split(Y.op.axis[0], factor=8)
        s[Y].vectorize(inner)
    module = kernelrpc.build(s, [X, Y], name="f")
    dev = kernelrpc.cpu(0)
    got = nd.empty((N, 2), dtype, dev)
    module(nd.array(x, dev), got)
    np.testing.assert_array_equal(got.numpy(), want)
    ref = np.zeros((N, 2), dtype)
    interp.run(te.lower(s, [X, Y]), x, ref)
    np.testing.assert_array_equal(ref, want)
