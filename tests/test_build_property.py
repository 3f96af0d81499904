"""Property test: random shapes and split factors, tiled + vectorized + parallel GEMM and an
elementwise op, always equal to numpy (tails included). Few examples: each one compiles."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, te

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(M=st.integers(1, 40), N=st.integers(1, 40), K=st.integers(1, 24),
       fm=st.integers(1, 9), fn=st.sampled_from([1, 3, 4, 8, 16]), fk=st.integers(1, 6),
       par=st.booleans())
def test_gemm_random_tiles(M, N, K, fm, fn, fk, par):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], fm, fn)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=fk)
    s[C].reorder(mo, no, ko, mi, ki, ni)
    s[C].vectorize(ni)
    if par:
        s[C].parallel(mo)
    module = kernelrpc.build(s, [A, B, C], name="gemm")
    rng = np.random.default_rng(M * 10007 + N * 101 + K)
    a = rng.random((M, K), dtype=np.float32)
    b = rng.random((K, N), dtype=np.float32)
    dev = kernelrpc.cpu(0)
    tc = nd.empty((M, N), "float32", dev)
    module(nd.array(a, dev), nd.array(b, dev), tc)
    np.testing.assert_allclose(tc.numpy(), a @ b, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(n=st.integers(1, 300), factor=st.sampled_from([1, 2, 5, 8, 16, 32, 64]),
       fuse_parallel=st.booleans(),
       dtype=st.sampled_from(["float32", "float64", "float16", "int32", "int8"]))
def test_elementwise_random_splits(n, factor, fuse_parallel, dtype):
    X = te.placeholder((n, 3), name="X", dtype=dtype)
    Y = te.compute((n, 3), lambda i, j: (X[i, j] * 3 + j - (i % 7)).astype(dtype), name="Y")
    s = te.create_schedule(Y.op)
    fused = s[Y].fuse(*Y.op.axis)
    outer, inner = s[Y].split(fused, factor=factor)
    s[Y].vectorize(inner)
    if fuse_parallel:
        s[Y].parallel(outer)
    module = kernelrpc.build(s, [X, Y], name="ew")
    x = (np.arange(n * 3).reshape(n, 3) % 11).astype(dtype)
    dev = kernelrpc.cpu(0)
    ty = nd.empty((n, 3), dtype, dev)
    module(nd.array(x, dev), ty)
    i = np.arange(n)[:, None]
    j = np.arange(3)[None, :]
    np.testing.assert_array_equal(ty.numpy(), (x * 3 + j - (i % 7)).astype(dtype))
