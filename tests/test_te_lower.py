"""Lowering of each schedule primitive: the IR's structure and its printed form."""
import io

import numpy as np
import pytest

from kernelrpc import te
from kernelrpc.compiler import interp, ir
from kernelrpc.compiler.expr import FloatImm, IntImm, Var, const
from kernelrpc.compiler.lower import PassConfigError
from kernelrpc.compiler.lower.vectorize import vectorize_func

import te_workloads as W


def nodes(func, cls):
    found = []
    ir.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, cls) else None)
    return found


def loops(func):
    return {f.var.name: (f.extent.value, f.kind) for f in nodes(func, ir.For)}


def test_baseline_prints_like_tvm():
    s, args = W.tutorial_step("baseline", 1024, 1024, 1024)
    text = str(te.lower(s, args, simple_mode=True))
    assert text.splitlines()[0] == "@main = primfn(A: handle, B: handle, C: handle) -> ()"
    assert "      C[((x*1024) + y)] = 0f32" in text
    assert ("        C[((x*1024) + y)] = (C[((x*1024) + y)] + "
            "(A[((x*1024) + k)]*B[((k*1024) + y)]))") in text


def test_blocking_and_vectorization_match_tutorial_ir():
    s, args = W.tutorial_step("vectorization", 1024, 1024, 1024)
    f = te.lower(s, args)
    assert loops(f) == {"x.outer": (32, "serial"), "y.outer": (32, "serial"),
                        "x.inner.init": (32, "serial"), "k.outer": (256, "serial"),
                        "k.inner": (4, "serial"), "x.inner": (32, "serial")}
    text = str(f)
    assert ("C[ramp((((x.outer*32768) + (x.inner.init*1024)) + (y.outer*32)), 1, 32)] = "
            "broadcast(0f32, 32)") in text
    assert ("(broadcast(A[((((x.outer*32768) + (x.inner*1024)) + (k.outer*4)) + k.inner)], 32)"
            "*B[ramp((((k.outer*4096) + (k.inner*1024)) + (y.outer*32)), 1, 32)])") in text


def test_array_packing_is_a_parallel_vectorized_stage():
    s, args = W.tutorial_step("array_packing", 1024, 1024, 1024)
    f = te.lower(s, args)
    alloc = nodes(f, ir.Allocate)
    assert [(a.buffer.name, a.buffer.size) for a in alloc] == [("packedB", 1024 * 1024)]
    text = str(f)
    assert 'for (x: int32, 0, 32) "parallel" {' in text
    assert ("packedB[ramp(((x*32768) + (y*32)), 1, 32)] = "
            "B[ramp(((y*1024) + (x*32)), 1, 32)]") in text
    assert "packedB[ramp((((y.outer*32768) + (k.outer*128)) + (k.inner*32)), 1, 32)]" in text


def test_cache_write_gives_small_local_buffer_with_unrolled_constant_offsets():
    s, args = W.tutorial_step("parallel", 1024, 1024, 1024)
    f = te.lower(s, args)
    cc = [a for a in nodes(f, ir.Allocate) if a.buffer.name == "C.global"]
    assert len(cc) == 1 and [d.value for d in cc[0].buffer.shape] == [32, 32]
    text = str(f)
    assert "k.inner" not in text                                   # unrolled away
    assert 'for (x.outer: int32, 0, 32) "parallel" {' in text
    assert "C.global[ramp((x.c*32), 1, 32)] = (C.global[ramp((x.c*32), 1, 32)] + " in text
    assert "packedB[ramp((((y.outer*32768) + (k.outer*128)) + 96), 1, 32)]" in text
    assert "C[((((x.outer*32768) + (x.inner*1024)) + (y.outer*32)) + y.inner)] = " \
           "C.global[((x.inner*32) + y.inner)]" in text


def test_microkernel_accumulators_have_constant_indices():
    s, args = W.microkernel(1024, 1024, 1024, mr=4, nr=64, lanes=16)
    f = te.lower(s, args)
    stores = [st for st in nodes(f, ir.Store) if st.buffer.name == "C.global"]
    # 16 zero-inits + 16 FMAs per k, all with constant 16-lane ramps
    assert len(stores) == 32
    for st in stores:
        assert isinstance(st.index, ir.Ramp) and isinstance(st.index.base, IntImm)
        assert st.index.lanes == 16
    k_loop = [lp for lp in nodes(f, ir.For) if lp.var.name == "k"][0]
    assert k_loop.extent.value == 1024 and len(k_loop.body.seq) == 16


def test_split_nparts_fuse_and_reorder():
    A = te.placeholder((12, 10), name="A")
    B = te.compute((12, 10), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B.op)
    i, j = B.op.axis
    io, ii = s[B].split(i, nparts=3)
    ij = s[B].fuse(ii, j)
    s[B].reorder(ij, io)
    f = te.lower(s, [A, B])
    assert loops(f) == {"i.inner.j.fused": (40, "serial"), "i.outer": (3, "serial")}
    # the fused axis's row and column fold back into one index: A[io*40 + ij]
    assert "floordiv" not in str(f) and "floormod" not in str(f)
    a = np.arange(120, dtype="float32").reshape(12, 10)
    b = np.zeros_like(a)
    interp.run(f, a, b)
    np.testing.assert_array_equal(b, a + 1)


def test_tail_of_nondividing_split_is_guarded():
    A = te.placeholder((10,), name="A")
    B = te.compute((10,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=4)
    with te.PassContext(opt_level=1):                 # no LoopPartition
        f = te.lower(s, [A, B])
    assert loops(f) == {"i.outer": (3, "serial"), "i.inner": (4, "serial")}
    (guard,) = nodes(f, ir.IfThenElse)
    assert str(guard.condition) == "(((i.outer*4) + i.inner) < 10)"


def test_loop_partition_splits_off_the_tail():
    A = te.placeholder((10,), name="A")
    B = te.compute((10,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=4)
    f = te.lower(s, [A, B])
    assert nodes(f, ir.IfThenElse) == []
    main, tail = f.body.seq
    assert (main.var.name, main.extent.value, main.body.extent.value) == ("i.outer", 2, 4)
    assert (tail.var.name, tail.extent.value) == ("i.inner", 2)
    s[B].vectorize(ii)
    f = te.lower(s, [A, B])
    assert str(f.body.seq[1]) == "B[ramp(8, 1, 2)] = (A[ramp(8, 1, 2)]*broadcast(2f32, 2))"


def test_divisible_split_has_no_guard():
    A = te.placeholder((12,), name="A")
    B = te.compute((12,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    s[B].split(B.op.axis[0], factor=4)
    assert nodes(te.lower(s, [A, B]), ir.IfThenElse) == []


def test_vectorized_tail_is_versioned_not_scalarized():
    A = te.placeholder((10,), name="A")
    B = te.compute((10,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=4)
    s[B].vectorize(ii)
    with te.PassContext(opt_level=1):
        f = te.lower(s, [A, B])
    (outer_if,) = [n for n in nodes(f, ir.IfThenElse) if n.else_case is not None]
    assert str(outer_if.condition) == "((i.outer*4) < 7)"
    assert isinstance(outer_if.then_case, ir.Store)
    assert isinstance(outer_if.then_case.index, ir.Ramp)
    scalar = []
    ir.post_order_visit(outer_if.else_case, scalar.append)
    assert not any(isinstance(n, ir.Ramp) for n in scalar)          # unrolled scalar lanes
    assert sum(isinstance(n, ir.Store) for n in scalar) == 4


def test_vectorize_falls_back_to_scalar_when_store_does_not_depend_on_lane():
    buf = ir.Buffer("X", (4,), "float32")
    v = Var("v")
    body = ir.Store(buf, ir.Load(buf, const(0)) + FloatImm(1.0), const(0))
    func = ir.PrimFunc("f", [buf], ir.For(v, const(0), const(4), "vectorized", body))
    out = vectorize_func(func)
    assert isinstance(out.body, ir.For) and out.body.kind == "unrolled"
    x = np.zeros(4, "float32")
    interp.run(out, x)
    assert x[0] == 4


def _lowered_copy(shape, index, lanes=8):
    """``B[i, j] = A[index(i, j)]`` with ``j`` split by ``lanes`` and vectorized, lowered."""
    A = te.placeholder((shape[0] * shape[1],), name="A")
    B = te.compute(shape, lambda i, j: A[index(i, j)], name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].split(B.op.axis[1], factor=lanes)[1])
    return te.lower(s, [A, B])


def test_a_reshape_index_in_one_block_of_lanes_loads_a_vector():
    """``floormod(j, 16)`` and ``floordiv(j, 16)`` of ``j = 8 jo + lane``: a ramp and a
    scalar (an im2col's reshape, 16-wide rows); a block the lanes cross stays a gather, a
    copy of which is left a loop."""
    f = _lowered_copy((4, 64), lambda i, j: (j // 16) * 64 + i * 16 + j % 16)
    (store,) = nodes(f, ir.Store)
    assert isinstance(store.index, ir.Ramp) and isinstance(store.value.index, ir.Ramp)
    a = np.arange(256, dtype="float32")
    b = np.empty((4, 64), "float32")
    interp.run(f, a, b)
    np.testing.assert_array_equal(b, a.reshape(4, 4, 16).transpose(1, 0, 2).reshape(4, 64))
    crossing = _lowered_copy((4, 60), lambda i, j: (j // 12) * 48 + i * 12 + j % 12)
    assert not any(isinstance(n.index, ir.Ramp) and n.index.lanes == 8
                   for n in nodes(crossing, ir.Store))
    b = np.empty((4, 60), "float32")
    interp.run(crossing, a[:240], b)
    np.testing.assert_array_equal(b, a[:240].reshape(5, 4, 12).transpose(1, 0, 2).reshape(4, 60))


def test_a_transposing_copy_stays_a_loop_and_computing_keeps_the_vector():
    """A copy whose lanes would gather (the innermost axis moved) is not vectorized; the
    same gather feeding arithmetic is."""
    f = _lowered_copy((8, 16), lambda i, j: j * 8 + i)
    assert not any(isinstance(n.index, ir.Ramp) for n in nodes(f, ir.Store))
    assert not ir.gathers(ir.Ramp(IntImm(0), IntImm(ir.MAX_STRIDED_LOAD), 8))
    a = np.arange(128, dtype="float32")
    b = np.empty((8, 16), "float32")
    interp.run(f, a, b)
    np.testing.assert_array_equal(b, a.reshape(16, 8).T)
    A = te.placeholder((128,), name="A")
    B = te.compute((8, 16), lambda i, j: te.exp(A[j * 8 + i]), name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].split(B.op.axis[1], factor=8)[1])
    assert any(isinstance(n.index, ir.Ramp) for n in nodes(te.lower(s, [A, B]), ir.Store))


def test_compute_at_infers_the_needed_region_and_guards_the_tail():
    n = 10
    A = te.placeholder((n + 2,), name="A")
    P = te.compute((n + 2,), lambda i: A[i] * 3.0, name="P")
    C = te.compute((n,), lambda i: P[i] + P[i + 1] + P[i + 2], name="C")
    s = te.create_schedule(C.op)
    io, ii = s[C].split(C.op.axis[0], factor=4)
    s[P].compute_at(s[C], io)
    with te.PassContext(opt_level=1):
        guarded = te.lower(s, [A, C])
    (alloc,) = nodes(guarded, ir.Allocate)
    assert [d.value for d in alloc.buffer.shape] == [6]          # 4 outputs + 2 halo
    text = str(guarded)
    assert "P[i] = (A[((i.outer*4) + i)]*3f32)" in text
    assert "if (((i.outer*4) + i) < 12) {" in text              # last block: 8..13 > 11
    partitioned = te.lower(s, [A, C])
    assert "for (i: int32, 0, 4) {\n    P[i] = (A[(i + 8)]*3f32)" in str(partitioned)
    a = np.arange(n + 2, dtype="float32")
    for f in (guarded, partitioned):
        c = np.zeros(n, "float32")
        interp.run(f, a, c)
        np.testing.assert_array_equal(c, 3 * (a[:-2] + a[1:-1] + a[2:]))


def test_compute_inline_substitutes_the_body():
    A = te.placeholder((8,), name="A")
    T = te.compute((8,), lambda i: A[i] + 1.0, name="T")
    C = te.compute((8,), lambda i: T[i] * T[i], name="C")
    s = te.create_schedule(C.op)
    s[T].compute_inline()
    f = te.lower(s, [A, C])
    assert nodes(f, ir.Allocate) == []
    assert "C[i] = ((A[i] + 1f32)*(A[i] + 1f32))" in str(f)


def test_nested_parallel_loops_become_serial():
    s, args = W.tutorial_step("parallel", 64, 64, 64, bn=16)
    C = args[2]
    cc_stage = [st for st in s.stages if st.op.name == "C.global"][0]
    cc_stage.parallel(cc_stage.op.axis[0])
    f = te.lower(s, args)
    kinds = [lp.kind for lp in nodes(f, ir.For)]
    assert kinds.count("parallel") == 2            # packedB's x and C's x.outer
    assert s[C] is not cc_stage


def test_pass_context_prints_after_each_pass_and_validates_options():
    s, args = W.tutorial_step("vectorization", 64, 64, 64)
    out = io.StringIO()
    with te.PassContext(opt_level=3, config={"print_ir_after_each": True}, out=out):
        te.lower(s, args)
    names = [line for line in out.getvalue().splitlines() if line.startswith("# After")]
    assert names == ["# After ScheduleOps:", "# After Simplify:", "# After LoopPartition:",
                     "# After NormalizeParallel:",
                     "# After VectorizeLoop:", "# After UnrollLoop:", "# After RemoveNoOp:",
                     "# After UnswitchLoop:", "# After InterleaveStores:", "# After VerifyVars:"]
    with pytest.raises(PassConfigError):
        te.PassContext(config={"no_such_option": 1})
    with pytest.raises(PassConfigError):
        te.PassContext(config={"unroll_max_extent": "8"})


def test_pass_context_disable_vectorize_and_unroll_limit():
    s, args = W.tutorial_step("block_write_cache", 64, 64, 64, bn=16)
    with te.PassContext(config={"disable_vectorize": True, "unroll_max_extent": 2}):
        f = te.lower(s, args)
    assert nodes(f, ir.Ramp) == []
    kinds = {lp.var.name: lp.kind for lp in nodes(f, ir.For)}
    assert kinds["k.inner"] == "unrolled" and kinds["y.c"] == "serial"


def test_lowering_errors_are_typed():
    A, B, C = W.gemm(8, 8, 8)
    s = te.create_schedule(C.op)
    with pytest.raises(te.LowerError, match="placeholder B"):
        te.lower(s, [A, C])
    with pytest.raises(te.ScheduleError):
        s[C].compute_inline()
    with pytest.raises(te.ScheduleError):
        s[C].split(C.op.axis[0], factor=0)
    xo, xi = s[C].split(C.op.axis[0], factor=4)
    with pytest.raises(te.ScheduleError):
        s[C].split(C.op.axis[0], factor=2)          # no longer a leaf
    with pytest.raises(te.ScheduleError):
        s[C].vectorize(C.op.reduce_axis[0])
    with pytest.raises(te.ScheduleError):
        s[C].fuse(xi, xo)                          # outer first


def test_compute_at_on_a_split_axis_is_reported():
    A, T, C = W.chain()
    s = te.create_schedule(C.op)
    s[T].compute_at(s[C], C.op.axis[0])
    s[C].split(C.op.axis[0], factor=2)
    with pytest.raises(te.LowerError, match="no longer a loop"):
        te.lower(s, [A, C])


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_other_dtypes(dtype):
    A, B, C = W.gemm(6, 5, 4, dtype)
    s = te.create_schedule(C.op)
    yo, yi = s[C].split(C.op.axis[1], factor=4)
    s[C].vectorize(yi)
    f = te.lower(s, [A, B, C])
    assert {n.dtype for n in nodes(f, ir.Load)} >= {f"{dtype}x4"}
    rng = np.random.default_rng(0)
    a = rng.integers(-5, 5, (6, 4)).astype(dtype)
    b = rng.integers(-5, 5, (4, 5)).astype(dtype)
    c = np.zeros((6, 5), dtype)
    interp.run(f, a, b, c)
    np.testing.assert_array_equal(c, a @ b)


def test_tutorial_float_shape_and_int32_limit():
    B = te.placeholder((64, 64), name="B")
    P = te.compute((64 / 32, 64, 32), lambda bigN, k, littleN: B[k, bigN * 32 + littleN],
                   name="packedB")
    assert [d.value for d in P.shape] == [2, 64, 32]
    with pytest.raises(te.TensorError):
        te.compute((64 / 7,), lambda i: B[i, 0])
    big = te.placeholder((65536, 32768), name="big")
    out = te.compute((1,), lambda i: big[0, i], name="out")
    with pytest.raises(te.LowerError, match="int32"):
        te.lower(te.create_schedule(out.op), [big, out])


def test_reduce_axis_outside_its_reduction_is_reported():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), "k")
    B = te.compute((4,), lambda i: A[i, k] * 2.0, name="B")
    with pytest.raises(te.LowerError, match="uses k"):
        te.lower(te.create_schedule(B.op), [A, B])


def test_compute_root_undoes_compute_at():
    A, T, C = W.chain()
    s = te.create_schedule(C.op)
    s[T].compute_at(s[C], C.op.axis[0])
    s[T].compute_root()
    f = te.lower(s, [A, C], name="twostage")
    assert f.name == "twostage" and isinstance(f.body, ir.Allocate)
    assert [lp.var.name for lp in nodes(f, ir.For)] == ["i", "i"]


def test_tvm_spellings():
    A = te.placeholder((6, 4), name="A")
    B = te.compute((6, 4), lambda i, j: A(i, j) + 1.0, name="B")
    i, j = B.op.axis
    assert i.dom.extent.value == 6 and i.dom.min.value == 0
    s = te.create_schedule(B.op)
    f = te.lower(s, [A, B])
    assert "B[((i*4) + j)] = (A[((i*4) + j)] + 1f32)" in str(f)
