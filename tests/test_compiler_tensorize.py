"""``te.decl_tensor_intrin`` + ``s[C].tensorize``: a GEMV micro-kernel written with the IR
builder replaces the inner loops of a matmul, checked against numpy, in the lowered IR,
and refused where it would compute something else."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc as tvm
from kernelrpc import te
from kernelrpc.te import ir_builder

M, L = 16, 64          # the intrinsic: c[m] = sum_k a[k] * b[m, k]


def gemv(m=M, l=L, with_update=True, combine=lambda x, y: x * y, with_reset=False):
    a = te.placeholder((l,), name="a")
    b = te.placeholder((m, l), name="b")
    k = te.reduce_axis((0, l), name="k")
    c = te.compute((m,), lambda i: te.sum(combine(a[k], b[i, k]), axis=k), name="c")

    def fcompute(ins, outs):
        def nest(reset):
            ib = ir_builder.create()
            pa, pb, pc = ib.buffer_ptr(ins[0]), ib.buffer_ptr(ins[1]), ib.buffer_ptr(outs[0])
            with ib.for_range(0, m, name="gemv_i") as i:
                if reset:
                    pc[i] = 0.0
                with ib.for_range(0, l, name="gemv_k") as kk:
                    pc[i] = pc[i] + pa[kk] * pb[i, kk]
            return ib.get()
        def zeros():
            ib = ir_builder.create()
            pc = ib.buffer_ptr(outs[0])
            with ib.for_range(0, m, name="gemv_zero") as i:
                pc[i] = 0.0
            return ib.get()
        body = nest(reset=True)
        reset = zeros() if with_reset else None
        return (body, reset, nest(reset=False)) if with_update else body

    return te.decl_tensor_intrin(c.op, fcompute, name="gemv")


def matmul(n=8, mm=64, k=256):
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((mm, k), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, mm), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
    return A, B, C


def run(s, A, B, C):
    f = tvm.build(s, [A, B, C])
    a = np.random.uniform(size=[d.value for d in A.shape]).astype("float32")
    b = np.random.uniform(size=[d.value for d in B.shape]).astype("float32")
    c = tvm.nd.empty([d.value for d in C.shape], "float32")
    f(tvm.nd.array(a), tvm.nd.array(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b.T, rtol=1e-5)


def test_gemv_replaces_the_inner_loops_with_the_reduction_split_outside():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    (r,) = C.op.reduce_axis
    jo, ji = s[C].split(j, factor=M)
    ro, ri = s[C].split(r, factor=L)
    s[C].reorder(i, jo, ro, ji, ri)
    s[C].tensorize(ji, gemv())
    lowered = str(tvm.lower(s, [A, B, C], simple_mode=True))
    assert "gemv_i" in lowered and "gemv_k" in lowered
    assert "ji" not in lowered and "ri" not in lowered.replace("primfn", "")
    assert "(r.outer == 0)" in lowered           # body on the first pass, update after
    run(s, A, B, C)


def test_a_reset_runs_once_before_the_outer_reduction_loops():
    """With ``reset``, the accumulators start before the reduction loops outside the
    intrinsic, over copies of the spatial loops between (here the column blocks inside the
    reduction), and every iteration accumulates: no branch on the first one."""
    A, B, C = matmul(n=3, mm=48, k=3 * L)
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    jo, ji = s[C].split(j, factor=M)
    ro, ri = s[C].split(C.op.reduce_axis[0], factor=L)
    s[C].reorder(i, ro, jo, ji, ri)
    s[C].tensorize(ji, gemv(with_reset=True))
    lowered = str(tvm.lower(s, [A, B, C], simple_mode=True))
    assert "(r.outer == 0)" not in lowered and "if " not in lowered
    assert lowered.index("gemv_zero") < lowered.index("r.outer") < lowered.index("gemv_k")
    assert "j.outer.init" in lowered
    run(s, A, B, C)


def test_gemv_covering_the_whole_reduction_needs_only_a_body():
    A, B, C = matmul(n=5, mm=32, k=L)
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    jo, ji = s[C].split(j, factor=M)
    s[C].tensorize(ji, gemv(with_update=False))
    assert "gemv_k" in str(tvm.lower(s, [A, B, C], simple_mode=True))
    run(s, A, B, C)


def _blocked(jfactor=M, lfactor=L):
    """C = A @ B.T with its column and reduction loops blocked for the intrinsic."""
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    jo, ji = s[C].split(C.op.axis[1], factor=jfactor)
    ro, ri = s[C].split(C.op.reduce_axis[0], factor=lfactor)
    s[C].reorder(C.op.axis[0], jo, ro, ji, ri)
    return s, ji, (A, B, C)


def test_a_mismatch_is_refused_when_lowering():
    s, ji, args = _blocked(jfactor=8)                # the intrinsic has 16 rows
    s[args[2]].tensorize(ji, gemv())
    with pytest.raises(te.LowerError, match="extent 8, the intrinsic's axis i has 16"):
        tvm.lower(s, list(args))

    s, ji, args = _blocked()
    s[args[2]].tensorize(ji, gemv(combine=lambda x, y: x + y))   # declares a sum of a + b
    with pytest.raises(te.LowerError, match="does not compute what c declares"):
        tvm.lower(s, list(args))

    s, ji, args = _blocked()
    s[args[2]].tensorize(ji, gemv(with_update=False))
    with pytest.raises(te.LowerError, match="must return"):
        tvm.lower(s, list(args))


def test_the_real_buffers_strides_reach_the_intrinsic():
    n, mm, k = 4, 16, 64
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, mm), name="B")       # B[r, j]: b[i, k] is B with strides (1, 16)
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, mm), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    s[C].tensorize(C.op.axis[1], gemv(with_update=False))
    assert "(gemv_k*16)" in str(tvm.lower(s, [A, B, C], simple_mode=True))
    f = tvm.build(s, [A, B, C])
    a = np.random.uniform(size=(n, k)).astype("float32")
    b = np.random.uniform(size=(k, mm)).astype("float32")
    c = tvm.nd.empty((n, mm), "float32")
    f(tvm.nd.array(a), tvm.nd.array(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-5)


def test_tensorize_takes_only_an_intrinsic_on_a_leaf():
    A, B, C = matmul()
    s = te.create_schedule(C.op)
    with pytest.raises(te.ScheduleError, match="decl_tensor_intrin"):
        s[C].tensorize(C.op.axis[1], "gemv")
    with pytest.raises(TypeError, match="single-output te.compute"):
        te.decl_tensor_intrin(A.op, lambda ins, outs: None)


def _cached_gemv_schedule(block):
    """C = A @ B.T with a cache_write stage computed at C's column blocks of ``block``, its
    inner loops tensorized (the shape of TVM's tensorize tutorial with a local tile)."""
    A, B, C = matmul(n=8, mm=64, k=256)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    jo, _ = s[C].split(C.op.axis[1], factor=block)
    s[CC].compute_at(s[C], jo)
    ci, cj = s[CC].op.axis
    cjo, cji = s[CC].split(cj, factor=M)
    ro, ri = s[CC].split(s[CC].op.reduce_axis[0], factor=L)
    s[CC].reorder(ci, cjo, ro, cji, ri)
    s[CC].tensorize(cji, gemv())
    return s, (A, B, C)


def test_a_compute_at_stage_is_tensorized_when_its_region_is_whole():
    s, (A, B, C) = _cached_gemv_schedule(32)
    lowered = str(tvm.lower(s, [A, B, C], simple_mode=True))
    assert "gemv_k" in lowered and "< 64" not in lowered     # the region's guards are proven
    run(s, A, B, C)


def test_a_partial_compute_at_region_is_refused_naming_it():
    s, (A, B, C) = _cached_gemv_schedule(48)      # 64 = 48 + 16: the last block is partial
    with pytest.raises(te.LowerError, match=r"the region compute_at gives C.global inside C's "
                       r"loop j.outer is not always whole .* split the loops of C by factors"):
        tvm.lower(s, [A, B, C])


def test_a_stage_attached_inside_the_tensorized_loops_is_refused_with_what_to_do():
    s, ji, (A, B, C) = _blocked()
    A2 = s.cache_read(A, "global", [C])              # a stage of its own, attached below
    ro = s[C].leaf_iter_vars[2]
    s[A2].compute_at(s[C], ji)
    s[C].tensorize(ji, gemv())
    with pytest.raises(te.LowerError,
                       match="A.global is attached .* attach it at r.outer or further out"):
        tvm.lower(s, [A, B, C])
    s[A2].compute_at(s[C], ro)
    run(s, A, B, C)
