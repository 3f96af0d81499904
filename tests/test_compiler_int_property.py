"""Property test: random integer expressions over every integer dtype (int8..int64,
uint8..uint64) compute exactly what two's complement arithmetic says -- wrap-around
included -- after the simplifier, in the reference interpreter and in compiled code
(scalar and vectorized)."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp
from kernelrpc.compiler.expr import int_range, wrap_int

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
N = 16
BINARY = ["add", "sub", "mul", "min", "max"]
DIVISION = ["floordiv", "floormod", "truncdiv", "truncmod"]
COMPARE = ["lt", "le", "gt", "ge", "eq", "ne"]


def _divisors(dtype):
    lo, hi = int_range(dtype)
    ds = [1, 2, 3, 7, 8, 16, 255, hi]
    if lo < 0:
        ds += [-2, -3, -8, lo]   # never -1: INT_MIN / -1 overflows in C
    return [d for d in ds if lo <= d <= hi]


def exprs(dtype):
    lo, hi = int_range(dtype)
    consts = st.one_of(st.sampled_from(sorted({lo, lo + 1, 0, 1, 2, 100, hi - 1, hi})),
                       st.integers(lo, hi))
    leaves = st.one_of(st.sampled_from([("x",), ("y",), ("i",)]), consts.map(lambda v: ("c", v)))

    def extend(children):
        return st.one_of(
            st.tuples(st.sampled_from(BINARY), children, children),
            st.tuples(st.sampled_from(DIVISION), children, st.sampled_from(_divisors(dtype))),
            st.tuples(st.just("select"), st.sampled_from(COMPARE), children, children,
                      children, children),
            st.tuples(st.just("cast"), st.sampled_from(DTYPES), children),
        )
    return st.recursive(leaves, extend, max_leaves=8)


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def reference(tree, dtype, x, y, i):
    """The exact machine value, with Python integers reduced to the dtype after each step."""
    def ev(t):
        kind = t[0]
        if kind == "x":
            return int(x)
        if kind == "y":
            return int(y)
        if kind == "i":
            return wrap_int(i, dtype)
        if kind == "c":
            return t[1]
        if kind == "cast":
            return wrap_int(wrap_int(ev(t[2]), t[1]), dtype)
        if kind == "select":
            a, b = ev(t[2]), ev(t[3])
            holds = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b,
                     "ne": a != b}[t[1]]
            return ev(t[4]) if holds else ev(t[5])
        a = ev(t[1])
        if kind in DIVISION:
            b = t[2]
            q = a // b if kind == "floordiv" else _trunc_div(a, b)
            value = {"floordiv": q, "truncdiv": q, "floormod": a - b * (a // b),
                     "truncmod": a - b * _trunc_div(a, b)}[kind]
            return wrap_int(value, dtype)
        b = ev(t[2])
        value = {"add": a + b, "sub": a - b, "mul": a * b, "min": min(a, b),
                 "max": max(a, b)}[kind]
        return wrap_int(value, dtype)
    return ev(tree)


def to_te(tree, dtype, X, Y, i):
    def ev(t):
        kind = t[0]
        if kind == "x":
            return X[i]
        if kind == "y":
            return Y[i]
        if kind == "i":
            return i.astype(dtype)
        if kind == "c":
            return te.const(t[1], dtype)
        if kind == "cast":
            return ev(t[2]).astype(t[1]).astype(dtype)
        if kind == "select":
            a, b = ev(t[2]), ev(t[3])
            cond = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b,
                    "eq": te.expr.EQ(a, b), "ne": te.expr.NE(a, b)}[t[1]]
            return te.if_then_else(cond, ev(t[4]), ev(t[5]))
        a = ev(t[1])
        if kind in DIVISION:
            b = te.const(t[2], dtype)
            return {"floordiv": te.floordiv, "floormod": te.floormod, "truncdiv": te.truncdiv,
                    "truncmod": te.truncmod}[kind](a, b)
        b = ev(t[2])
        return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                "min": lambda: te.min(a, b), "max": lambda: te.max(a, b)}[kind]()
    return ev(tree)


def _data(dtype, seed):
    lo, hi = int_range(dtype)
    rng = np.random.default_rng(seed)
    edge = [lo, lo + 1, hi, hi - 1, 0, 1, 2, 127 if hi >= 127 else 1]
    out = []
    for k in range(N):
        out.append(edge[k] if k < len(edge) and rng.random() < 0.5
                   else int(rng.integers(lo, hi, endpoint=True, dtype=np.int64
                                         if hi < 2**63 else np.uint64)))
    return np.array(out, dtype=dtype)


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    return dtype, draw(exprs(dtype)), draw(st.integers(0, 2**16))


def _setup(dtype, tree, seed):
    X = te.placeholder((N,), name="X", dtype=dtype)
    Y = te.placeholder((N,), name="Y", dtype=dtype)
    Z = te.compute((N,), lambda i: to_te(tree, dtype, X, Y, i), name="Z")
    x, y = _data(dtype, seed), _data(dtype, seed + 1)
    want = np.array([reference(tree, dtype, x[k], y[k], k) for k in range(N)], dtype=dtype)
    return X, Y, Z, x, y, want


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_simplified_integer_expressions_in_the_interpreter(case):
    dtype, tree, seed = case
    X, Y, Z, x, y, want = _setup(dtype, tree, seed)
    s = te.create_schedule(Z.op)
    z = np.zeros(N, dtype)
    interp.run(te.lower(s, [X, Y, Z]), x, y, z)
    np.testing.assert_array_equal(z, want, err_msg=f"{dtype} {tree}")


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.booleans())
def test_simplified_integer_expressions_compiled(case, vectorize):
    dtype, tree, seed = case
    X, Y, Z, x, y, want = _setup(dtype, tree, seed)
    s = te.create_schedule(Z.op)
    if vectorize:
        _, inner = s[Z].split(Z.op.axis[0], factor=8)
        s[Z].vectorize(inner)
    module = kernelrpc.build(s, [X, Y, Z], name="f")
    dev = kernelrpc.cpu(0)
    out = nd.empty((N,), dtype, dev)
    module(nd.array(x, dev), nd.array(y, dev), out)
    np.testing.assert_array_equal(out.numpy(), want, err_msg=f"{dtype} {tree}")


def test_known_wrapping_rewrites():
    """Cases the old simplifier (or the interpreter: a uint64 min beyond int64) got wrong, pinned down."""
    for dtype, tree in [
        ("uint8", ("select", "lt", ("x",), ("y",), ("c", 1), ("c", 0))),
        ("int8", ("select", "lt", ("add", ("x",), ("c", 100)), ("c", 50), ("c", 1), ("c", 0))),
        ("uint32", ("floordiv", ("add", ("x",), ("c", 4)), 2)),
        ("int16", ("min", ("add", ("x",), ("c", 1)), ("x",))),
        ("int32", ("floormod", ("mul", ("x",), ("c", 65536)), 3)),
        ("uint64", ("min", ("c", (1 << 64) - 2), ("select", "lt", ("x",), ("y",), ("x",), ("c", 0)))),
    ]:
        X, Y, Z, x, y, want = _setup(dtype, tree, 7)
        z = np.zeros(N, dtype)
        interp.run(te.lower(te.create_schedule(Z.op), [X, Y, Z]), x, y, z)
        np.testing.assert_array_equal(z, want, err_msg=f"{dtype} {tree}")
