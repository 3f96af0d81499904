"""Property tests: random shapes and schedules lower to IR that computes what numpy does.

The interpreter bounds-checks every access and fills scratch buffers with NaN, so an
out-of-bounds access or a value read before it was produced fails the test.
"""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelrpc import te
from kernelrpc.compiler import interp

import te_workloads as W

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
dims = st.integers(1, 13)
factors = st.integers(1, 6)


@st.composite
def gemm_schedules(draw):
    M, N, K = draw(dims), draw(dims), draw(dims)
    fm, fn, fk = draw(factors), draw(factors), draw(factors)
    use_cache = draw(st.booleans())
    A, B, C = W.gemm(M, N, K)
    s = te.create_schedule(C.op)
    target = s.cache_write(C, "global") if use_cache else C
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], fm, fn)
    if use_cache:
        s[target].compute_at(s[C], draw(st.sampled_from([mo, no])))
        mc, nc = s[target].op.axis
    else:
        mc, nc = mi, ni
    (k,) = s[target].op.reduce_axis
    ko, ki = s[target].split(k, factor=fk)
    if draw(st.booleans()):
        s[target].reorder(ko, mc, ki, nc)
    else:
        s[target].reorder(ko, ki, mc, nc)
    if draw(st.booleans()):
        s[target].vectorize(nc)
    if draw(st.booleans()):
        s[target].unroll(ki)
    if draw(st.booleans()):
        s[C].parallel(mo)
    return (M, N, K), s, [A, B, C]


@SETTINGS
@given(gemm_schedules(), st.integers(0, 3))
def test_random_gemm_schedules(case, opt_level):
    (M, N, K), s, args = case
    rng = np.random.default_rng(M * 100 + N * 10 + K)
    a = rng.standard_normal((M, K)).astype("float32")
    b = rng.standard_normal((K, N)).astype("float32")
    c = np.full((M, N), np.nan, "float32")
    with te.PassContext(opt_level=opt_level):
        func = te.lower(s, args)
    interp.run(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@st.composite
def elementwise_schedules(draw):
    n, m = draw(dims), draw(dims)
    A = te.placeholder((n, m), name="A")
    T = te.compute((n, m), lambda i, j: A[i, j] * 2.0, name="T")
    C = te.compute((n, m), lambda i, j: T[i, j] + A[i, j], name="C")
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    if draw(st.booleans()):
        io, ii = s[C].split(i, nparts=draw(factors))
    else:
        io, ii = s[C].split(i, factor=draw(factors))
    jo, ji = s[C].split(j, factor=draw(factors))
    order = draw(st.permutations([io, ii, jo, ji]))
    s[C].reorder(*order)
    leaves = s[C].leaf_iter_vars
    if draw(st.booleans()):
        fused = s[C].fuse(leaves[0], leaves[1])
        leaves = s[C].leaf_iter_vars
        s[C].parallel(fused)
    placement = draw(st.sampled_from(["root", "inline", "at"]))
    if placement == "inline":
        s[T].compute_inline()
    elif placement == "at":
        s[T].compute_at(s[C], draw(st.sampled_from(leaves)))
    kind = draw(st.sampled_from(["none", "vectorize", "unroll"]))
    if kind != "none":
        getattr(s[C], kind)(leaves[-1])
    return (n, m), s, [A, C]


@SETTINGS
@given(elementwise_schedules())
def test_random_elementwise_schedules(case):
    (n, m), s, args = case
    a = np.arange(n * m, dtype="float32").reshape(n, m)
    c = np.full((n, m), np.nan, "float32")
    interp.run(te.lower(s, args), a, c)
    np.testing.assert_array_equal(c, 3 * a)


@st.composite
def stencil_schedules(draw):
    """C[i, j] = P[i, j] + P[i + 1, j + 2] with P computed at a random loop of C."""
    n, m = draw(dims), draw(dims)
    A = te.placeholder((n + 1, m + 2), name="A")
    P = te.compute((n + 1, m + 2), lambda i, j: A[i, j] * 2.0, name="P")
    C = te.compute((n, m), lambda i, j: P[i, j] + P[i + 1, j + 2], name="C")
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    io, ii = s[C].split(i, factor=draw(factors))
    jo, ji = s[C].split(j, factor=draw(factors))
    s[C].reorder(io, jo, ii, ji)
    if draw(st.booleans()):
        s[C].vectorize(ji)
    s[P].compute_at(s[C], draw(st.sampled_from([io, jo, ii, ji])))
    pi, pj = P.op.axis
    pjo, pji = s[P].split(pj, factor=draw(factors))
    kind = draw(st.sampled_from(["none", "vectorize", "unroll"]))
    if kind != "none":
        getattr(s[P], kind)(pji)
    return (n, m), s, [A, C]


@SETTINGS
@given(stencil_schedules())
def test_random_compute_at_stencils(case):
    (n, m), s, args = case
    a = np.arange((n + 1) * (m + 2), dtype="float32").reshape(n + 1, m + 2)
    c = np.full((n, m), np.nan, "float32")
    interp.run(te.lower(s, args), a, c)
    np.testing.assert_array_equal(c, 2 * (a[:-1, :-2] + a[1:, 2:]))


@SETTINGS
@given(n=dims, m=st.integers(1, 40), f1=factors, f2=factors, f3=factors)
def test_nested_splits_visit_each_reduction_element_once(n, m, f1, f2, f3):
    A, R = W.row_reduce(n, m)
    s = te.create_schedule(R.op)
    (k,) = R.op.reduce_axis
    ko, ki = s[R].split(k, factor=f1)
    kio, kii = s[R].split(ki, factor=f2)
    koo, koi = s[R].split(ko, nparts=f3)
    s[R].reorder(R.op.axis[0], kii, koi, kio, koo)
    a = np.ones((n, m), "float32")
    r = np.zeros(n, "float32")
    interp.run(te.lower(s, [A, R]), a, r)
    np.testing.assert_array_equal(r, np.full(n, m, "float32"))


@SETTINGS
@given(M=dims, N=st.integers(1, 40), K=dims, mr=st.integers(1, 4),
       nr=st.sampled_from([4, 8, 16]), lanes=st.sampled_from([2, 4]),
       pack_per_panel=st.booleans(), mc=st.one_of(st.none(), st.integers(1, 12)))
def test_random_register_blocked_microkernels(M, N, K, mr, nr, lanes, pack_per_panel, mc):
    """Any tile, and row blocks of any size (``mc``: not whole tiles, not dividing M)."""
    s, args = W.microkernel(M, N, K, mr, nr, lanes, pack_per_panel, mc=mc)
    rng = np.random.default_rng(M + N + K)
    a = rng.standard_normal((M, K)).astype("float32")
    b = rng.standard_normal((K, N)).astype("float32")
    c = np.full((M, N), np.nan, "float32")
    interp.run(te.lower(s, args), a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
