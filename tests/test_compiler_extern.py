"""te.extern with an IR builder body (TVM's tir.ir_builder), between compute stages; te.scan;
tir.call_extern of C functions linked into the module."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te, tir
from kernelrpc.compiler import interp
from kernelrpc.compiler.build import UndefinedSymbolError
from kernelrpc.compiler.codegen.emitter import CodegenError
from kernelrpc.deploy import toolchain
from kernelrpc.deploy.toolchain import create_shared


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


# --------------------------------------------------------------------------- C functions

SCALE_C = r"""
#include <stdint.h>
/* out[i] = in[i] * k + 1 for i < n; returns n */
int32_t scale_add(float *out, const float *in, int32_t n, float k) {
    for (int32_t i = 0; i < n; ++i) out[i] = in[i] * k + 1.0f;
    return n;
}
"""
NEGATE_C = r"""
#include <stdint.h>
int64_t negate_wide(int16_t x) { return -(int64_t)x; }
"""


def _scale_add_module(n, **build_args):
    """A te.extern stage that calls the C function scale_add, read by a compute stage that
    calls libm's cbrtf; returns (module, reference(a))."""
    A = te.placeholder((n,), name="A")
    S = te.extern((n,), [A], lambda ins, outs: tir.call_extern(
        "int32", "scale_add", outs[0], ins[0], n, 2.0), name="S")
    C = te.compute((n,), lambda i: S[i] + tir.call_extern("float32", "cbrtf", A[i]), name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=8)
    s[C].parallel(xo)
    s[C].vectorize(xi)      # the call keeps the loop scalar
    module = kernelrpc.build(s, [A, C], name="scaled", **build_args)
    return module, lambda a: a * 2 + 1 + np.cbrt(a)


def _run(module, a):
    dev = kernelrpc.cpu(0)
    out = nd.empty(a.shape, "float32", dev)
    module(nd.array(a, dev), out)
    return out.numpy()


def test_call_extern_links_a_c_source_of_the_user_and_libm(tmp_path):
    source = tmp_path / "scale.c"
    source.write_text(SCALE_C)
    module, reference = _scale_add_module(37, sources=[source])
    lowered = module.get_source("lowered")
    assert "call_extern(int32, 'scale_add', &S[0], &A[0], 37, 2f32)" in lowered
    assert "call_extern(float32, 'cbrtf', A[" in lowered
    a = np.random.default_rng(0).random(37, dtype=np.float32) * 10
    np.testing.assert_allclose(_run(module, a), reference(a), rtol=1e-6)


def test_call_extern_links_an_object_and_extends_small_integers(tmp_path):
    source = tmp_path / "negate.c"
    source.write_text(NEGATE_C)
    obj = tmp_path / "negate.o"
    subprocess.run([*toolchain.find_host_cc(), "-fPIC", "-O2", "-c", str(source), "-o", str(obj)],
                   check=True)
    X = te.placeholder((6,), name="X", dtype="int16")
    Y = te.compute((6,), lambda i: tir.call_extern("int64", "negate_wide", X[i]), name="Y")
    module = kernelrpc.build(te.create_schedule(Y.op), [X, Y], name="neg", objects=[obj])
    assert "declare i64 @negate_wide(i16 signext)" in module.get_source()
    x = np.array([-32768, -1, 0, 1, 300, 32767], dtype=np.int16)
    dev = kernelrpc.cpu(0)
    y = nd.empty((6,), "int64", dev)
    module(nd.array(x, dev), y)
    np.testing.assert_array_equal(y.numpy(), -x.astype(np.int64))


def test_a_missing_c_function_fails_the_link_naming_it(tmp_path):
    module, _ = _scale_add_module(8)
    with pytest.raises(UndefinedSymbolError, match=r"C function\(s\) scale_add \(tir.call_extern\)"
                       r".*sources=\[\.\.\.\]") as info:
        module.export_library(tmp_path / "m.so")
    assert info.value.symbols == ["scale_add"]
    assert not (tmp_path / "m.so").exists()
    other = tmp_path / "other.c"
    other.write_text("int not_it(void) { return 1; }\n")
    module, _ = _scale_add_module(8, sources=[other])
    with pytest.raises(UndefinedSymbolError, match=r"scale_add .*\(" + re.escape(str(other))):
        module(nd.array(np.zeros(8, "float32")), nd.empty((8,), "float32"))


def test_the_user_sources_are_in_the_relocatable_object_too(tmp_path):
    source = tmp_path / "scale.c"
    source.write_text(SCALE_C)
    module, reference = _scale_add_module(16, sources=[source])
    obj = module.save(tmp_path / "scaled.o")
    lib = create_shared(tmp_path / "scaled.so", [obj])
    a = np.arange(16, dtype=np.float32)
    loaded = kernelrpc.runtime.load_module(str(lib))
    dev = kernelrpc.cpu(0)
    out = nd.empty((16,), "float32", dev)
    loaded["scaled"](nd.array(a, dev), out)
    np.testing.assert_allclose(out.numpy(), reference(a), rtol=1e-6)


def test_call_extern_with_a_void_function_and_access_ptr(tmp_path):
    """ib.emit of a void call, an offset pointer (TVM's access_ptr), libc's memcpy."""
    def body(ins, outs):
        ib = te.ir_builder.create()
        ib.emit(tir.call_extern("void", "memset", outs[0], 0, 40))
        ib.emit(tir.call_extern("int64", "memcpy", outs[0].access_ptr("w", 2),
                                ins[0].access_ptr("r", 1), 16))
        return ib.get()
    X = te.placeholder((10,), name="X")
    Y = te.extern((10,), [X], body, name="Y")
    module = kernelrpc.build(te.create_schedule(Y.op), [X, Y], name="copy")
    x = np.arange(1, 11, dtype=np.float32)
    want = np.zeros(10, np.float32)
    want[2:6] = x[1:5]
    np.testing.assert_array_equal(_run(module, x), want)
    with pytest.raises(interp.InterpError, match="cannot call the C function memset"):
        interp.run(te.lower(te.create_schedule(Y.op), [X, Y]), x, np.zeros(10, np.float32))


def test_call_extern_refuses_what_a_c_call_cannot_take():
    X = te.placeholder((4,), name="X", dtype="uint32")
    with pytest.raises(TypeError, match="argument 0 is uint32"):
        tir.call_extern("int32", "f", X[0])
    with pytest.raises(TypeError, match="not the name of a C function"):
        tir.call_extern("int32", "f(x)")
    with pytest.raises(TypeError, match="not the name of a C function"):
        tir.call_extern("int32", "__kernelrpc_time")
    with pytest.raises(TypeError, match="return type bool"):
        tir.call_extern("bool", "f")
    with pytest.raises(NotImplementedError, match="call_extern"):
        tir.call_packed("tvm.contrib.cblas.matmul", X)
    Y = te.compute((4,), lambda i: tir.call_extern("int32", "abs", 1)
                   + tir.call_extern("int64", "labs", 1).astype("int32"), name="Y")
    Z = te.compute((4,), lambda i: Y[i] + tir.call_extern("int64", "abs", 1).astype("int32"),
                   name="Z")
    with pytest.raises(CodegenError, match="abs is called with two signatures"):
        kernelrpc.build(te.create_schedule(Z.op), [Z], name="twice")


@pytest.mark.cross
@pytest.mark.skipif(not toolchain.zig_installed(), reason="needs the cross extra (ziglang)")
def test_call_extern_cross_built_runs_on_an_emulated_board(tmp_path):
    """The user's C source compiled for aarch64 by the module's cross toolchain (zig cc),
    run under qemu-user; the missing-function error comes from that linker too."""
    import cross_rootfs

    source = tmp_path / "scale.c"
    source.write_text(SCALE_C)
    target = "llvm -mtriple=aarch64-linux-gnu"
    module, reference = _scale_add_module(21, target=target, sources=[source])
    path = module.export_library(tmp_path / "scaled.so")
    missing, _ = _scale_add_module(21, target=target)
    with pytest.raises(UndefinedSymbolError, match="scale_add"):
        missing.export_library(tmp_path / "missing.so")
    try:
        cross_rootfs.rootfs("aarch64")
    except cross_rootfs.Unavailable as exc:
        pytest.skip(str(exc))
    a = np.arange(21, dtype=np.float32)
    script = ("import sys\nfrom kernelrpc import runtime\n"
              "m = runtime.load_module(sys.argv[1]); dev = runtime.cpu(0)\n"
              "a = runtime.empty((21,), 'float32', dev); c = runtime.empty((21,), 'float32', dev)\n"
              "a.copyfrom(bytes.fromhex(sys.argv[2])); m['scaled'](a, c)\n"
              "print(bytes(c.buffer).hex())\n")
    proc = cross_rootfs.run_in_rootfs("aarch64", ["-c", script, str(path), a.tobytes().hex()])
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = np.frombuffer(bytes.fromhex(proc.stdout.strip()), dtype=np.float32)
    np.testing.assert_allclose(got, reference(a), rtol=1e-6)


GEMV_C = r"""
#include <stdint.h>
/* c[i] (+)= sum_k a[k] * b[i * ldb + k], i < m, k < l */
int32_t gemv_c(float *c, const float *a, const float *b, int32_t m, int32_t l, int32_t ldb,
               int32_t reset) {
    for (int32_t i = 0; i < m; ++i) {
        float acc = reset ? 0.0f : c[i];
        for (int32_t k = 0; k < l; ++k) acc += a[k] * b[i * ldb + k];
        c[i] = acc;
    }
    return 0;
}
"""


def test_a_tensor_intrinsic_whose_body_is_a_c_function(tmp_path):
    """TVM's tensorize tutorial: the micro-kernel is C, called with the regions' addresses
    and the real buffer's row stride."""
    source = tmp_path / "gemv.c"
    source.write_text(GEMV_C)
    m, l = 16, 64
    a = te.placeholder((l,), name="a")
    b = te.placeholder((m, l), name="b")
    k = te.reduce_axis((0, l), name="k")
    c = te.compute((m,), lambda i: te.sum(a[k] * b[i, k], axis=k), name="c")

    def fcompute(ins, outs):
        def call(reset):
            return tir.call_extern("int32", "gemv_c", outs[0], ins[0], ins[1], m, l,
                                   ins[1].strides[0], reset)
        return call(1), None, call(0)
    gemv = te.decl_tensor_intrin(c.op, fcompute, name="gemv")
    n, mm, kk = 5, 32, 256
    A = te.placeholder((n, kk), name="A")
    B = te.placeholder((mm, kk), name="B")
    r = te.reduce_axis((0, kk), name="r")
    C = te.compute((n, mm), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
    s = te.create_schedule(C.op)
    jo, ji = s[C].split(C.op.axis[1], factor=m)
    ro, ri = s[C].split(C.op.reduce_axis[0], factor=l)
    s[C].reorder(C.op.axis[0], jo, ro, ji, ri)
    s[C].tensorize(ji, gemv)
    module = kernelrpc.build(s, [A, B, C], name="mm", sources=[source])
    assert "gemv_c" in module.get_source("lowered")
    rng = np.random.default_rng(3)
    av, bv = rng.random((n, kk), dtype=np.float32), rng.random((mm, kk), dtype=np.float32)
    dev = kernelrpc.cpu(0)
    out = nd.empty((n, mm), "float32", dev)
    module(nd.array(av, dev), nd.array(bv, dev), out)
    np.testing.assert_allclose(out.numpy(), av @ bv.T, rtol=1e-5)


def test_a_let_in_a_vectorized_loop_is_a_vector_where_it_is_used():
    """``1 - z`` with ``z`` a let of the vectorized loop: the constant is broadcast to the
    let's lanes (it was once emitted as a scalar operation on a vector)."""
    def body(ins, outs):
        ib = te.ir_builder.create()
        x, y = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
        with ib.for_range(0, 5, name="i", kind="vectorize") as i:
            z = ib.let("z", x[i] * 2.0)
            y[i] = (te.const(1.0, "float32") - z) * z
        return ib.get()
    X = te.placeholder((5,), name="X")
    Y = te.extern((5,), [X], body, name="Y")
    module = kernelrpc.build(te.create_schedule(Y.op), [X, Y], name="let_lanes")
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    np.testing.assert_allclose(_run(module, x), (1 - 2 * x) * 2 * x, rtol=1e-6)
