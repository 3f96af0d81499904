"""The same unsigned integer expressions (wrap-around, comparisons, floor division) compiled
by Apache TVM and by kernelrpc give the same answers, and numpy's."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te

pytestmark = pytest.mark.tvm
tvm = pytest.importorskip("tvm", reason="apache-tvm is not installed")

N = 16
CASES = {
    "select_lt": lambda T, x, z: T.select(x < z, x + z, x - z),
    "select_ge": lambda T, x, z: T.select(x >= z, x * T.const(3), z - T.const(1)),
    "wrap_then_compare": lambda T, x, z: T.select(x + T.const(100) < T.const(50), x, z),
    "floordiv_mod": lambda T, x, z: (T.floordiv(x + T.const(7), T.const(3))
                                     + T.floormod(z, T.const(5))),
    "min_max": lambda T, x, z: T.max(T.min(x, z) - T.const(2), x),
}


class _Ops:
    """The operations CASES use, from one library, with constants of ``dtype``."""

    def __init__(self, dtype, select, const, floordiv, floormod, min, max):
        self.dtype, self.select, self._const = dtype, select, const
        self.floordiv, self.floormod, self.min, self.max = floordiv, floormod, min, max

    def const(self, v):
        return self._const(v, self.dtype)


def _ours(dtype):
    return _Ops(dtype, te.if_then_else, te.const, te.floordiv, te.floormod, te.min, te.max)


def _tvm(dtype):
    return _Ops(dtype, tvm.tirx.Select, tvm.tirx.const, tvm.tirx.floordiv, tvm.tirx.floormod,
                tvm.tirx.min, tvm.tirx.max)


def _numpy(dtype):
    return _Ops(dtype, np.where, lambda v, d: np.asarray(v, d), np.floor_divide, np.mod,
                np.minimum, np.maximum)


def _tvm_run(case, dtype, x, z):
    X = tvm.te.placeholder((N,), name="X", dtype=dtype)
    Z = tvm.te.placeholder((N,), name="Z", dtype=dtype)
    Y = tvm.te.compute((N,), lambda i: CASES[case](_tvm(dtype), X[i], Z[i]), name="Y")
    mod = tvm.compile(tvm.te.create_prim_func([X, Z, Y]), target="llvm")
    dev = tvm.cpu(0)
    out = tvm.runtime.tensor(np.zeros(N, dtype), dev)
    mod(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(z, dev), out)
    return out.numpy()


def _our_run(case, dtype, x, z):
    X = te.placeholder((N,), name="X", dtype=dtype)
    Z = te.placeholder((N,), name="Z", dtype=dtype)
    Y = te.compute((N,), lambda i: CASES[case](_ours(dtype), X[i], Z[i]), name="Y")
    module = kernelrpc.build(te.create_schedule(Y.op), [X, Z, Y], name="f")
    out = nd.empty((N,), dtype)
    module(nd.array(x), nd.array(z), out)
    return out.numpy()


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answers_as_tvm(case, dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(len(case))
    x = np.concatenate([[0, 1, info.max, info.max - 1, 49, 50, 156, 200],
                        rng.integers(0, info.max, 8, endpoint=True)]).astype(dtype)
    z = np.concatenate([[1, 0, 0, info.max, 50, 49, 3, 100],
                        rng.integers(0, info.max, 8, endpoint=True)]).astype(dtype)
    ours = _our_run(case, dtype, x, z)
    np.testing.assert_array_equal(ours, _tvm_run(case, dtype, x, z))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ours, CASES[case](_numpy(dtype), x, z).astype(dtype))
