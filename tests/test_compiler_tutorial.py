"""The flow of TVM's "Getting started with TE" tutorial, in kernelrpc's own code, written the
way TVM users write it (``import kernelrpc as tvm``): a vector add over a symbolic length,
scheduled parallel and vectorized, timed, saved and loaded again."""
from __future__ import annotations

import numpy as np

import kernelrpc as tvm
from kernelrpc import runtime, te


def test_vector_add_with_a_symbolic_length(tmp_path):
    tgt = tvm.Target("llvm")
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    fadd = tvm.build(s, [A, B, C], tgt, name="myadd")
    dev = tvm.cpu(0)
    n = 1024
    a = tvm.nd.array(np.random.uniform(size=n).astype(A.dtype), dev)
    b = tvm.nd.array(np.random.uniform(size=n).astype(B.dtype), dev)
    c = tvm.nd.array(np.zeros(n, dtype=C.dtype), dev)
    fadd(a, b, c)
    np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy())
    evaluator = fadd.time_evaluator(fadd.entry_name, dev, number=10)
    assert evaluator(a, b, c).mean > 0
    assert "for (i: int32, 0, n)" in str(tvm.lower(s, [A, B, C], simple_mode=True))

    # parallel, then vectorized, as the tutorial does next
    factor = 4
    outer, inner = s[C].split(C.op.axis[0], factor=factor)
    s[C].parallel(outer)
    s[C].vectorize(inner)
    fadd_vector = tvm.build(s, [A, B, C], tgt, name="myadd_vector")
    for size in (1024, 1001):
        a = tvm.nd.array(np.random.uniform(size=size).astype(A.dtype), dev)
        b = tvm.nd.array(np.random.uniform(size=size).astype(B.dtype), dev)
        c = tvm.nd.array(np.zeros(size, dtype=C.dtype), dev)
        fadd_vector(a, b, c)
        np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy())

    # saving and loading the module
    path = fadd_vector.export_library(tmp_path / "myadd.so")
    loaded = runtime.load_module(str(path))
    loaded["myadd_vector"](a, b, c)
    np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy())
