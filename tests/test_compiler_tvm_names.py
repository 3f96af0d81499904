"""The TVM-named helpers user code reaches through ``import kernelrpc as tvm``: ``tvm.target``,
``tvm.testing``, ``tvm.tir``, ``tvm.contrib.cc`` / ``utils`` and ``Module.save``."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kernelrpc as tvm
from kernelrpc import te


def test_importing_kernelrpc_loads_no_compiler_and_lists_the_new_names():
    script = ("import sys, kernelrpc\n"
              "assert {'target', 'testing', 'tir', 'contrib'} <= set(dir(kernelrpc))\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in "
              "{'numpy', 'llvmlite'} or m.startswith('kernelrpc.compiler')))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_target_as_the_tutorial_spells_it():
    tgt = tvm.target.Target(target="llvm", host="llvm")
    assert tgt.kind.name == "llvm" and tgt.kind == "llvm"
    assert tgt.host_string.startswith("llvm -mtriple=")
    generic = tvm.target.Target("llvm -mcpu=generic")
    assert generic.cpu == "generic" and generic.kind.name == "llvm"
    assert tvm.device(tgt.kind.name, 0) == tvm.cpu(0)
    with pytest.raises(tvm.target.TargetError, match="must start with 'llvm'"):
        tvm.target.Target(target="cuda", host="llvm")


def test_assert_allclose_takes_tensors_and_refuses_broadcasting():
    x = tvm.nd.array(np.arange(4, dtype="float32"))
    tvm.testing.assert_allclose(x, np.arange(4, dtype="float32"))
    with pytest.raises(AssertionError, match="shapes differ"):
        tvm.testing.assert_allclose(np.zeros((1, 4)), np.zeros(4))
    with pytest.raises(AssertionError):
        tvm.testing.assert_allclose(x, np.arange(4) + 1e-3)
    tvm.testing.assert_allclose(x.numpy() + 1e-3, x, atol=1e-2)


def test_tir_index_helpers_are_the_floor_operations():
    A = te.placeholder((10,), name="A", dtype="int32")
    C = te.compute((10,), lambda i: A[tvm.tir.indexmod(i + 7, 10)] + tvm.tir.indexdiv(i, 3),
                   name="C")
    f = tvm.build(te.create_schedule(C.op), [A, C])
    a = tvm.nd.array(np.arange(10, dtype="int32") * 5)
    c = tvm.nd.empty((10,), "int32")
    f(a, c)
    i = np.arange(10)
    np.testing.assert_array_equal(c.numpy(), a.numpy()[(i + 7) % 10] + i // 3)


def test_saved_object_links_into_a_loadable_module_with_create_shared():
    from kernelrpc.contrib import cc, utils

    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    f = tvm.build(te.create_schedule(B.op), [A, B], name="double")
    with utils.tempdir() as temp:
        f.save(temp.relpath("double.o"))
        f.save(temp.relpath("double.ll"))
        assert "__kernelrpc_fn_double" in open(temp.relpath("double.ll")).read()
        cc.create_shared(temp.relpath("double.so"), temp.relpath("double.o"))
        loaded = tvm.runtime.load_module(temp.relpath("double.so"))
        a = tvm.nd.array(np.arange(7, dtype="float32"))
        b = tvm.nd.empty((7,), "float32")
        loaded(a, b)
        np.testing.assert_array_equal(b.numpy(), a.numpy() * 2)
        assert loaded.entry_name == "double"
        with pytest.raises(ValueError, match="cannot save a module as 'bin'"):
            f.save(temp.relpath("double.bin"))
        path = temp.path
    assert not os.path.exists(path)


# ------------------------------------------------------------------ the TE names TVM users call

def _run(s, args, *arrays, out_shapes):
    """Build ``s`` for ``args``, call it on ``arrays`` and new float32 outputs; the outputs."""
    f = tvm.build(s, args)
    outs = [tvm.nd.empty(shape, "float32") for shape in out_shapes]
    f(*[tvm.nd.array(a) for a in arrays], *outs)
    return [o.numpy() for o in outs]


def test_tir_ir_builder_is_te_ir_builder_and_builds_an_extern_body():
    assert tvm.tir.ir_builder is te.ir_builder
    n = 16
    A = te.placeholder((n,), name="A")

    def body(ins, outs):
        ib = tvm.tir.ir_builder.create()
        a, c = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
        with ib.for_range(0, n, name="i") as i:
            c[i] = a[i] * 3.0
        return ib.get()
    C = te.extern((n,), [A], body, name="C")
    a = np.arange(n, dtype="float32")
    (c,) = _run(te.create_schedule(C.op), [A, C], a, out_shapes=[(n,)])
    np.testing.assert_array_equal(c, a * 3)


def test_nextafter_steps_one_ulp_towards_its_second_argument():
    A = te.placeholder((6,), name="A")
    B = te.placeholder((6,), name="B")
    C = te.compute((6,), lambda i: te.nextafter(A[i], B[i]), name="C")
    a = np.array([1, 1, 0, -2, 3.5, 1e30], dtype="float32")
    b = np.array([2, 0, 1, -3, 3.5, np.inf], dtype="float32")
    (c,) = _run(te.create_schedule(C.op), [A, B, C], a, b, out_shapes=[(6,)])
    np.testing.assert_array_equal(c, np.nextafter(a, b))
    assert not np.array_equal(c, a)  # one ulp moved, except where a == b
    with pytest.raises(TypeError, match="float16"):
        te.nextafter(te.placeholder((1,), dtype="float16")[0], 1.0)


def test_tag_scope_tags_ops_declared_inside_as_tvm():
    A = te.placeholder((4,), name="A")
    with te.tag_scope(tag="elemwise"):
        B = te.compute((4,), lambda i: A[i] + 1, name="B")
    C = te.compute((4,), lambda i: B[i] * 2, name="C")
    assert B.op.tag == "elemwise" and C.op.tag == ""

    @te.tag_scope(tag="injective")
    def double(x):
        return te.compute(x.shape, lambda i: x[i] * 2, name="D")
    assert double(A).op.tag == "injective"
    with pytest.raises(ValueError, match="nested"):
        with te.tag_scope("a"):
            with te.tag_scope("b"):
                pass
    with pytest.raises(ValueError, match="nested tags"):
        with te.tag_scope("a"):
            te.compute((4,), lambda i: A[i], name="E", tag="b")
    with pytest.warns(UserWarning, match="was not used"):
        with te.tag_scope("unused"):
            pass


def test_gradient_of_an_elementwise_body_is_its_derivative_times_the_head():
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: te.exp(A[i]) * A[i] + te.sqrt(A[i]) / (A[i] + 2.0)
                   - te.tanh(te.max(A[i], 0.5)), name="B")
    H = te.placeholder((n,), name="H")
    (dA,) = te.gradient(B, [A], head=H)
    a = np.random.default_rng(1).uniform(0.1, 1.0, n).astype("float32")
    h = np.random.default_rng(2).uniform(-1, 1, n).astype("float32")
    (got,) = _run(te.create_schedule(dA.op), [A, H, dA], a, h, out_shapes=[(n,)])
    x = a.astype("float64")
    sq = np.sqrt(x)
    expect = (np.exp(x) * x + np.exp(x) + (0.5 / sq * (x + 2) - sq) / (x + 2) ** 2
              - np.where(x >= 0.5, 1 - np.tanh(x) ** 2, 0))
    np.testing.assert_allclose(got, h * expect, rtol=2e-5, atol=1e-6)


def test_gradient_of_a_matmul_with_bias_is_the_transposed_products_and_the_row_sums():
    m, k, n = 12, 10, 7
    A = te.placeholder((m, k), name="A")
    W = te.placeholder((k, n), name="W")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), "r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * W[r, j], axis=r), name="C")
    D = te.compute((m, n), lambda i, j: C[i, j] + bias[j], name="D")
    L = te.compute((m, n), lambda i, j: D[i, j] * D[i, j], name="L")   # a loss of squares
    H = te.placeholder((m, n), name="H")
    dA, dW, dbias = te.gradient(L, [A, W, bias], head=H)
    assert [list(map(int, (d.value for d in g.shape))) for g in (dA, dW, dbias)] == [[m, k], [k, n], [n]]
    rng = np.random.default_rng(3)
    a, w, b, h = (rng.standard_normal(s).astype("float32") for s in ((m, k), (k, n), (n,), (m, n)))
    s = te.create_schedule([dA.op, dW.op, dbias.op])
    got_a, got_w, got_b = _run(s, [A, W, bias, H, dA, dW, dbias], a, w, b, h,
                               out_shapes=[(m, k), (k, n), (n,)])
    g = h * 2 * (a @ w + b)            # dL/dD
    np.testing.assert_allclose(got_a, g @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_w, a.T @ g, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_b, g.sum(axis=0), rtol=1e-4, atol=1e-4)


def test_gradient_without_head_is_the_jacobian_and_shifted_reads_are_scattered_back():
    n = 6
    A = te.placeholder((n,), name="A")
    # a 3-point stencil over the interior: the read A[i + 1] and A[i - 1]
    B = te.compute((n - 2,), lambda i: A[i] * A[i + 1] - 2.0 * A[i + 2], name="B")
    (J,) = te.gradient(B, [A])
    assert len(J.shape) == 2
    a = np.arange(1, n + 1, dtype="float32")
    (got,) = _run(te.create_schedule(J.op), [A, J], a, out_shapes=[(n - 2, n)])
    expect = np.zeros((n - 2, n), dtype="float32")
    for i in range(n - 2):
        expect[i, i] += a[i + 1]
        expect[i, i + 1] += a[i]
        expect[i, i + 2] += -2.0
    np.testing.assert_allclose(got, expect)


def test_gradient_names_what_it_cannot_differentiate():
    A = te.placeholder((4, 4), name="A")
    r = te.reduce_axis((0, 4), "r")
    M = te.compute((4,), lambda i: te.max(A[i, r], axis=r), name="M")
    with pytest.raises(te.GradientError, match="M is a max reduction; only sums"):
        te.gradient(M, [A])
    F = te.compute((4, 4), lambda i, j: te.fmod(A[i, j], 3.0), name="F")
    with pytest.raises(te.GradientError, match=r"fmod\(\) cannot be differentiated"):
        te.gradient(F, [A])
    I = te.placeholder((4,), name="I", dtype="int32")
    with pytest.raises(te.GradientError, match="only float"):
        te.gradient(te.compute((4,), lambda i: I[i] * 2, name="K"), [I])


def test_create_prim_func_is_the_lowered_function_build_takes():
    n = 32
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((n,), lambda i: B[i] * 2.0, name="C")
    func = te.create_prim_func([A, C])
    assert isinstance(func, tvm.tir.PrimFunc) and [p.name for p in func.params] == ["A", "C"]
    func = func.with_attr("global_symbol", "addone_twice")
    mod = tvm.build(func, target="llvm")
    a = tvm.nd.array(np.arange(n, dtype="float32"))
    c = tvm.nd.empty((n,), "float32")
    mod["addone_twice"](a, c)
    np.testing.assert_array_equal(c.numpy(), (np.arange(n) + 1.0) * 2.0)


def test_create_group_places_its_stages_together():
    n, t = 64, 8
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((n,), lambda i: B[i] * 3.0, name="C")
    D = te.compute((n,), lambda i: C[i] - A[i], name="D")
    s = te.create_schedule(D.op)
    group = s.create_group(outputs=C, inputs=A)
    assert [st.op.name for st in group.stages] == ["B", "C"]
    xo, _ = s[D].split(D.op.axis[0], factor=t)
    group.compute_at(s[D], xo)
    text = str(tvm.lower(s, [A, D]))
    loops = text.split(f"for (i.outer: int32, 0, {n // t})")
    assert len(loops) == 2 and "B[" in loops[1] and "C[" in loops[1]   # inside D's outer loop
    (d,) = _run(s, [A, D], np.arange(n, dtype="float32"), out_shapes=[(n,)])
    np.testing.assert_array_equal(d, (np.arange(n) + 1.0) * 3.0 - np.arange(n))
    assert [st.op.name for st in s.create_group(C, A, include_inputs=True).stages] == ["B", "C"]
    assert [st.op.name for st in s.create_group(C, B, include_inputs=True).stages] == ["B", "C"]
    assert [st.op.name for st in s.create_group(C, B).stages] == ["C"]


def test_set_store_predicate_stores_only_where_it_holds():
    n = 16
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    s[B].set_store_predicate(B.op.axis[0] % 3 == 0)
    f = tvm.build(s, [A, B])
    a = tvm.nd.array(np.arange(n, dtype="float32"))
    b = tvm.nd.array(np.full(n, -1.0, dtype="float32"))
    f(a, b)
    i = np.arange(n)
    np.testing.assert_array_equal(b.numpy(), np.where(i % 3 == 0, i * 2.0, -1.0))


def test_scopes_and_gpu_only_primitives_are_accepted_and_say_what_they_do_here():
    n = 16
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((n,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C.op)
    s[B].set_scope("local")
    assert "storage_scope = local" in str(tvm.lower(s, [A, C]))
    with pytest.warns(te.SchedulePrimitiveIgnored, match="GPU memory"):
        s[B].set_scope("shared")
    with pytest.warns(te.SchedulePrimitiveIgnored, match="double_buffer.*no such copy"):
        s[B].double_buffer()
    (c,) = _run(s, [A, C], np.arange(n, dtype="float32"), out_shapes=[(n,)])
    np.testing.assert_array_equal(c, (np.arange(n) + 1.0) * 2.0)


def _stencil(H, W, reduce=False):
    """C[i, j] = B[i, j] + B[i + 1, j] + B[i + 2, j] over B = A * 2 + 1 (or a row sum of A)."""
    A = te.placeholder((H + 2, W), name="A")
    if reduce:
        k = te.reduce_axis((0, W), "k")
        B = te.compute((H + 2, W), lambda i, j: te.sum(A[i, k] * (j + 1.0), axis=k), name="B")
    else:
        B = te.compute((H + 2, W), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    C = te.compute((H, W), lambda i, j: B[i, j] + B[i + 1, j] + B[i + 2, j], name="C")
    return A, B, C


def _expect(a, reduce=False):
    b = a.sum(axis=1, keepdims=True) * (np.arange(a.shape[1]) + 1.0) if reduce else a * 2 + 1
    return b[:-2] + b[1:-1] + b[2:]


@pytest.mark.parametrize("reduce", [False, True])
def test_rolling_buffer_computes_each_row_once_in_a_circular_buffer(reduce):
    H, W = 11, 8
    A, B, C = _stencil(H, W, reduce)
    s = te.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    s[B].rolling_buffer()
    text = str(tvm.lower(s, [A, C]))
    # three rows, allocated outside the loop over rows, indexed modulo 3; a new row per iteration
    assert f"allocate(B: Pointer(global float32), float32, [3, {W}])" in text
    assert text.index("allocate(B") < text.index("for (i: int32, 0, 11)")
    assert "floormod((i + 2), 3)" in text and "(i == 0) || (i_1 >= 2)" in text
    a = np.random.default_rng(4).standard_normal((H + 2, W)).astype("float32")
    (c,) = _run(s, [A, C], a, out_shapes=[(H, W)])
    np.testing.assert_allclose(c, _expect(a, reduce), rtol=1e-5, atol=1e-5)


def test_rolling_buffer_under_a_split_loop_and_a_region_that_does_not_move():
    H, W = 13, 16
    A, B, C = _stencil(H, W)
    s = te.create_schedule(C.op)
    io, ii = s[C].split(C.op.axis[0], factor=4)      # 13 rows: a guarded tail
    s[B].compute_at(s[C], ii)
    s[B].rolling_buffer()
    a = np.random.default_rng(5).standard_normal((H + 2, W)).astype("float32")
    (c,) = _run(s, [A, C], a, out_shapes=[(H, W)])
    np.testing.assert_allclose(c, _expect(a), rtol=1e-5, atol=1e-5)
    # attached at the column loop, B's region (three rows, one column) moves along j: rolls there
    A, B, C = _stencil(H, W)
    s = te.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[1])
    s[B].rolling_buffer()
    (c,) = _run(s, [A, C], a, out_shapes=[(H, W)])
    np.testing.assert_allclose(c, _expect(a), rtol=1e-5, atol=1e-5)
    # a stage whose region is the same in every iteration of the loop is computed once
    A = te.placeholder((W,), name="A")
    B = te.compute((W,), lambda j: A[j] * 3.0, name="B")
    C = te.compute((H, W), lambda i, j: B[j] + i, name="C")
    s = te.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    s[B].rolling_buffer()
    assert "if (i == 0)" in str(tvm.lower(s, [A, C]))
    av = np.arange(W, dtype="float32")
    (c,) = _run(s, [A, C], av, out_shapes=[(H, W)])
    np.testing.assert_array_equal(c, av * 3.0 + np.arange(H)[:, None])


def test_rolling_buffer_refuses_what_cannot_roll():
    A, B, C = _stencil(8, 8)
    s = te.create_schedule(C.op)
    s[B].rolling_buffer()
    with pytest.raises(te.LowerError, match="must be computed at a loop"):
        tvm.lower(s, [A, C])
    s[B].compute_at(s[C], C.op.axis[0])
    s[C].parallel(C.op.axis[0])
    with pytest.raises(te.LowerError, match="is parallel; a rolling buffer"):
        tvm.lower(s, [A, C])


def test_gradient_of_an_unrelated_input_is_zero_and_one_tensor_gives_a_list():
    A = te.placeholder((5,), name="A")
    Z = te.placeholder((3,), name="Z")
    B = te.compute((5,), lambda i: A[i] * A[i], name="B")
    grads = te.gradient(B, Z, head=te.placeholder((5,), name="H"))
    assert isinstance(grads, list) and len(grads) == 1
    (dZ,) = grads
    (z,) = _run(te.create_schedule(dZ.op), [dZ], out_shapes=[(3,)])
    np.testing.assert_array_equal(z, np.zeros(3))
