"""LLVM code generation from hand-built loop IR, run natively and checked against numpy.

These tests exercise the backend alone (no schedules): each builds a PrimFunc, exports the
shared library of docs/module-format.md and calls it through ctypes with the packed calling
convention, the way a device loads it.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import struct

import numpy as np
import pytest

from kernelrpc.compiler import expr as E
from kernelrpc.compiler import ir
from kernelrpc.compiler.build import build
from kernelrpc.compiler.codegen import CodegenError

c = E.const


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A 64-byte aligned, C-contiguous copy (the module format's buffer guarantee)."""
    raw = np.empty(array.nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    out = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def run(func: ir.PrimFunc, *values, tmp_path, name: str | None = None):
    """Build ``func``, export it, call it once; returns the (aligned) arrays after the call."""
    module = build(func)
    path = module.export_library(tmp_path / f"{name or func.name}.so")
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    meta = getattr(lib, "__kernelrpc_metadata")
    meta.restype = ctypes.c_char_p
    doc = json.loads(meta())
    assert doc["functions"][0]["name"] == func.name
    arrays, slots = [], []
    argv = (ctypes.c_void_p * max(1, len(values)))()
    for k, (param, value) in enumerate(zip(func.params, values)):
        if isinstance(param, ir.Buffer):
            array = aligned_copy(np.asarray(value, dtype=param.dtype))
            arrays.append(array)
            argv[k] = array.ctypes.data
        else:
            slot = ctypes.c_uint64(0)
            raw = np.array([value], dtype=param.dtype).tobytes()
            ctypes.memmove(ctypes.addressof(slot), raw, len(raw))
            slots.append(slot)
            argv[k] = ctypes.addressof(slot)
    fn = getattr(lib, f"__kernelrpc_fn_{func.name}")
    fn.restype = ctypes.c_int32
    assert fn(argv) == 0
    return arrays


def vec(base, lanes, stride=1):
    return ir.Ramp(base, c(stride), lanes)


def test_vector_add_with_tail_and_parallel_loop(tmp_path):
    n = 1000
    A, B, C = (ir.Buffer(x, (n,)) for x in "ABC")
    xo, xi = E.Var("xo"), E.Var("xi")
    main = ir.For(xo, c(0), c(n // 16), "parallel",
                  ir.Store(C, E.Add(ir.Load(A, vec(xo * 16, 16)), ir.Load(B, vec(xo * 16, 16))),
                           vec(xo * 16, 16)))
    idx = xi + (n // 16) * 16
    tail = ir.For(xi, c(0), c(n % 16), "serial",
                  ir.Store(C, E.Add(ir.Load(A, idx), ir.Load(B, idx)), idx))
    f = ir.PrimFunc("vadd", [A, B, C], ir.seq(main, tail))
    a, b = np.random.rand(n).astype("float32"), np.random.rand(n).astype("float32")
    _, _, out = run(f, a, b, np.zeros(n), tmp_path=tmp_path)
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    text = build(f).get_source("ll")
    assert re.search(r"load <16 x float>, ptr %[\w.]+, align 64", text)


def test_alignment_follows_the_index(tmp_path):
    A, B = ir.Buffer("A", (64,)), ir.Buffer("B", (64,))
    x = E.Var("x")
    # base 4*x+1 is only 4-byte aligned; base 8*x is 32-byte aligned
    body = ir.seq(ir.Store(B, ir.Load(A, vec(x * 4 + 1, 8)), vec(x * 8, 8)))
    f = ir.PrimFunc("align", [A, B], ir.For(x, c(0), c(7), "serial", body))
    text = build(f).get_source("ll")
    assert re.search(r"load <8 x float>, ptr %[\w.]+, align 4\b", text)
    assert re.search(r"store <8 x float> %[\w.]+, ptr %[\w.]+, align 32\b", text)
    a = np.arange(64, dtype="float32")
    _, out = run(f, a, np.zeros(64), tmp_path=tmp_path)
    expect = np.zeros(64, "float32")
    for i in range(7):
        expect[i * 8:i * 8 + 8] = a[i * 4 + 1:i * 4 + 9]
    np.testing.assert_array_equal(out, expect)


def test_multiply_add_becomes_fma():
    A, B, C = (ir.Buffer(x, (64,)) for x in "ABC")
    x = E.Var("x")
    idx = vec(x * 16, 16)
    body = ir.Store(C, E.Add(ir.Load(C, idx), E.Mul(ir.Load(A, idx), ir.Load(B, idx))), idx)
    f = ir.PrimFunc("fma", [A, B, C], ir.For(x, c(0), c(4), "serial", body))
    asm = build(f, target="llvm -mcpu=znver4").get_source("asm")
    assert "vfmadd" in asm


def test_index_arithmetic_is_nsw_and_data_arithmetic_wraps(tmp_path):
    """An index's signed adds and multiplies carry ``nsw`` (a wrapped index is out of bounds),
    the stored value's do not: int32 data still wraps as numpy's does."""
    A = ir.Buffer("A", (64,), "int32")
    B = ir.Buffer("B", (16,), "int32")
    x = E.Var("x")
    value = E.Mul(ir.Load(A, x * 3 + 1), c(1 << 30, "int32"))
    f = ir.PrimFunc("nsw", [A, B], ir.For(x, c(0), c(16), "serial", ir.Store(B, value, x)))
    text = build(f).get_source("ll")
    assert re.search(r"(mul|add) nsw i32", text)
    assert re.search(r"mul i32 %\S+, 1073741824", text)
    a = np.arange(64, dtype=np.int32)
    _, out = run(f, a, np.zeros(16, np.int32), tmp_path=tmp_path)
    np.testing.assert_array_equal(out, a[np.arange(16) * 3 + 1] * np.int32(1 << 30))


def test_strided_and_broadcast_indices_gather_and_scatter(tmp_path):
    A, B, C = ir.Buffer("A", (64,)), ir.Buffer("B", (32,)), ir.Buffer("C", (8,))
    x = E.Var("x")
    gather = ir.Store(B, ir.Load(A, vec(x * 2, 8, stride=2)), vec(x * 8, 8))
    scatter = ir.Store(C, ir.Load(A, ir.Broadcast(x, 4)), vec(x, 4, stride=2))
    f = ir.PrimFunc("gs", [A, B, C], ir.seq(
        ir.For(x, c(0), c(4), "serial", gather),
        ir.For(x, c(0), c(1), "serial", scatter)))
    a = np.arange(64, dtype="float32")
    _, b, cc = run(f, a, np.zeros(32), np.full(8, -1), tmp_path=tmp_path)
    expect_b = np.concatenate([a[2 * x:2 * x + 16:2] for x in range(4)])
    np.testing.assert_array_equal(b, expect_b)
    np.testing.assert_array_equal(cc, [0, -1, 0, -1, 0, -1, 0, -1])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_semantics(tmp_path, dtype):
    values = np.array([-9, -8, -7, -1, 0, 1, 7, 8, 9], dtype)
    n = len(values)
    A = ir.Buffer("A", (n,), dtype)
    outs = [ir.Buffer(f"O{k}", (n,), dtype) for k in range(7)]
    x = E.Var("x")
    a = ir.Load(A, x)
    d = E.Var("d", dtype)
    exprs = [E.floordiv(a, c(4, dtype)), E.floormod(a, c(4, dtype)), E.floordiv(a, c(3, dtype)),
             E.floormod(a, c(-3, dtype)), E.floordiv(a, d), E.truncdiv(a, d), E.truncmod(a, d)]
    body = ir.seq(*[ir.Store(o, e, x) for o, e in zip(outs, exprs)])
    f = ir.PrimFunc("divs", [A, d, *outs], ir.For(x, c(0), c(n), "serial", body))
    results = run(f, values, -3, *[np.zeros(n)] * 7, tmp_path=tmp_path)[1:]
    np.testing.assert_array_equal(results[0], values // 4)
    np.testing.assert_array_equal(results[1], values % 4)
    np.testing.assert_array_equal(results[2], values // 3)
    np.testing.assert_array_equal(results[3], values % -3)
    np.testing.assert_array_equal(results[4], values // -3)
    np.testing.assert_array_equal(results[5], np.trunc(values / -3).astype(dtype))
    np.testing.assert_array_equal(results[6], np.fmod(values, -3))


def test_casts_selects_bools_and_math(tmp_path):
    n = 16
    X = ir.Buffer("X", (n,), "float32")
    I = ir.Buffer("I", (n,), "int32")
    M = ir.Buffer("M", (n,), "bool")
    Y = ir.Buffer("Y", (n,), "float64")
    x = E.Var("x")
    v = ir.Load(X, x)
    body = ir.seq(
        ir.Store(I, E.cast(v * 10.0, "int32"), x),
        ir.Store(M, E.logical_and(v > 0.25, E.logical_not(v > 0.75)), x),
        ir.Store(Y, E.cast(E.if_then_else(v > 0.5, E.call_math("exp", v),
                                          E.call_math("tanh", v) + E.call_math("sqrt", v)),
                           "float64"), x))
    f = ir.PrimFunc("mix", [X, I, M, Y], ir.For(x, c(0), c(n), "serial", body))
    xs = np.linspace(-0.9, 0.99, n).astype("float32")
    xs[xs < 0] = np.abs(xs[xs < 0])
    _, i, m, y = run(f, xs, np.zeros(n), np.zeros(n, bool), np.zeros(n), tmp_path=tmp_path)
    np.testing.assert_array_equal(i, (xs * np.float32(10)).astype("int32"))
    np.testing.assert_array_equal(m, (xs > 0.25) & ~(xs > 0.75))
    expect = np.where(xs > 0.5, np.exp(xs), np.tanh(xs) + np.sqrt(xs)).astype("float64")
    np.testing.assert_allclose(y, expect, rtol=1e-6)


@pytest.mark.parametrize("lanes", [1, 16])
def test_rounding_to_int32_is_one_step_and_rounds_ties_to_even(tmp_path, lanes):
    """``int32(nearbyint(x))`` is ``llvm.lrint`` (x86: ``cvtps2dq``, not a rounding then a
    truncation): ties go to the even integer, as numpy's ``rint``; vectors and scalars."""
    n = 32
    X, I = ir.Buffer("X", (n,), "float32"), ir.Buffer("I", (n,), "int32")
    x = E.Var("x")
    index = vec(x * lanes, lanes) if lanes > 1 else x
    body = ir.Store(I, E.cast(E.call_math("nearbyint", ir.Load(X, index)), "int32"), index)
    f = ir.PrimFunc("rint", [X, I], ir.For(x, c(0), c(n // lanes), "serial", body))
    assert "llvm.lrint" in build(f).get_source("ll")
    xs = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.50000006, 254.5, -255.5,
                   1e6 + 0.5, -3.7, 3.7, 0.0, -0.0, 7.5] * 2, "float32")
    _, got = run(f, xs, np.zeros(n), tmp_path=tmp_path, name=f"rint{lanes}")
    np.testing.assert_array_equal(got, np.rint(xs).astype("int32"))


def test_vector_math_and_min_max(tmp_path):
    X, Y = ir.Buffer("X", (32,)), ir.Buffer("Y", (32,))
    x = E.Var("x")
    v = ir.Load(X, vec(x * 16, 16))
    body = ir.Store(Y, E.maximum(E.call_math("exp", v), ir.Broadcast(c(1.5), 16)), vec(x * 16, 16))
    f = ir.PrimFunc("vmath", [X, Y], ir.For(x, c(0), c(2), "serial", body))
    xs = np.linspace(-2, 2, 32).astype("float32")
    _, y = run(f, xs, np.zeros(32), tmp_path=tmp_path)
    np.testing.assert_allclose(y, np.maximum(np.exp(xs), 1.5), rtol=1e-6)


def test_heap_and_stack_allocations_and_scalar_params(tmp_path):
    """A big buffer (heap), a small one (stack), a float scalar and an int scalar."""
    n = 40_000
    A, B = ir.Buffer("A", (n,)), ir.Buffer("B", (n,))
    big = ir.Buffer("big", (n,), scope="global")
    small = ir.Buffer("small", (4,), scope="local")
    alpha, count = E.Var("alpha", "float32"), E.Var("count", "int32")
    x, y = E.Var("x"), E.Var("y")
    fill = ir.For(x, c(0), count, "parallel", ir.Store(big, ir.Load(A, x) * alpha, x))
    use = ir.For(y, c(0), count, "serial", ir.Allocate(small, ir.seq(
        ir.Store(small, ir.Load(big, y) + 1.0, c(2)),
        ir.Store(B, ir.Load(small, c(2)), y))))
    f = ir.PrimFunc("alloc", [A, B, alpha, count], ir.Allocate(big, ir.seq(fill, use)))
    text = build(f).get_source("ll")
    assert "@__kernelrpc_workspace_alloc" in text and "@__kernelrpc_workspace_free" in text
    a = np.random.rand(n).astype("float32")
    _, b = run(f, a, np.zeros(n), 3.0, n - 5, tmp_path=tmp_path)
    np.testing.assert_allclose(b[:n - 5], a[:n - 5] * 3 + 1, rtol=1e-6)
    assert not b[n - 5:].any()


def test_allocas_stay_in_the_entry_block():
    A = ir.Buffer("A", (64,))
    acc = ir.Buffer("acc", (16,), scope="local")
    x = E.Var("x")
    body = ir.For(x, c(0), c(4), "serial", ir.Allocate(acc, ir.seq(
        ir.Store(acc, ir.Load(A, vec(x * 16, 16)), vec(c(0), 16)),
        ir.Store(A, ir.Load(acc, vec(c(0), 16)), vec(x * 16, 16)))))
    text = build(ir.PrimFunc("ent", [A], body)).get_source("ll")
    for fn in re.findall(r"define .*?\n}", text, re.S):
        blocks = re.split(r"\n(?=\S+:)", fn)
        for block in blocks[1:]:
            if not block.startswith("entry:"):
                assert "alloca" not in block


@pytest.mark.parametrize("extent", [1, 2, 5, 37, 1001])
def test_parallel_loop_covers_every_iteration_once_at_any_thread_count(tmp_path, extent):
    """Each task runs its own share, then helps with the others' (shares of one iteration,
    of none, more tasks than iterations): every iteration still runs exactly once."""
    A = ir.Buffer("A", (extent, 8))
    i = E.Var("i")
    body = ir.Store(A, ir.Load(A, vec(i * 8, 8)) + ir.Broadcast(c(1.0), 8), vec(i * 8, 8))
    f = ir.PrimFunc("par", [A], ir.For(i, c(0), c(extent), "parallel", body))
    module = build(f)
    lib = ctypes.CDLL(str(module.export_library(tmp_path / "par.so")), mode=os.RTLD_LOCAL)
    lib.__kernelrpc_set_num_threads.restype = ctypes.c_int32
    fn = lib.__kernelrpc_fn_par
    fn.restype = ctypes.c_int32
    for threads in (1, 2, 3, 7):
        assert lib.__kernelrpc_set_num_threads(threads) == threads
        for _ in range(20):
            array = aligned_copy(np.zeros((extent, 8), np.float32))
            argv = (ctypes.c_void_p * 1)(array.ctypes.data)
            assert fn(argv) == 0
            np.testing.assert_array_equal(array, np.ones((extent, 8)))


def test_nested_parallel_runs_inner_serially(tmp_path):
    A = ir.Buffer("A", (6, 5), "int32")
    i, j = E.Var("i"), E.Var("j")
    body = ir.For(i, c(0), c(6), "parallel", ir.For(
        j, c(0), c(5), "parallel", ir.Store(A, i * 10 + j, i * 5 + j)))
    (out,) = run(ir.PrimFunc("nest", [A], body), np.zeros((6, 5)), tmp_path=tmp_path)
    np.testing.assert_array_equal(out, np.arange(6)[:, None] * 10 + np.arange(5))


def test_if_then_else_and_let(tmp_path):
    A = ir.Buffer("A", (10,), "int32")
    i, t = E.Var("i"), E.Var("t")
    body = ir.LetStmt(t, i * 3, ir.IfThenElse(E.floormod(i, 2) == 0, ir.Store(A, t, i),
                                               ir.Store(A, -t, i)))
    (out,) = run(ir.PrimFunc("branch", [A], ir.For(i, c(0), c(10), "serial", body)),
                 np.zeros(10), tmp_path=tmp_path)
    np.testing.assert_array_equal(out, [0, -3, 6, -9, 12, -15, 18, -21, 24, -27])


def test_bad_names_and_unbound_vars_are_codegen_errors():
    A = ir.Buffer("A", (4,))
    with pytest.raises(CodegenError, match="C identifier"):
        build(ir.PrimFunc("bad name", [A], ir.Store(A, c(1.0), c(0))))
    stray = E.Var("stray")
    with pytest.raises(CodegenError, match="stray"):
        build(ir.PrimFunc("f", [A], ir.Store(A, c(1.0), stray)))


def test_float_constants_are_exact(tmp_path):
    A = ir.Buffer("A", (3,), "float32")
    D = ir.Buffer("D", (2,), "float64")
    f = ir.PrimFunc("consts", [A, D], ir.seq(
        ir.Store(A, c(0.1, "float32"), c(0)), ir.Store(A, c(float("inf"), "float32"), c(1)),
        ir.Store(A, c(-3.4e38, "float32"), c(2)), ir.Store(D, c(0.1, "float64"), c(0)),
        ir.Store(D, c(1e300, "float64"), c(1))))
    a, d = run(f, np.zeros(3), np.zeros(2), tmp_path=tmp_path)
    assert struct.pack("<f", a[0]) == struct.pack("<f", np.float32(0.1))
    assert a[1] == np.inf and a[2] == np.float32(-3.4e38)
    assert d[0] == 0.1 and d[1] == 1e300


def _guarded_array(n_floats: int):
    """A float32 array that ends exactly where an inaccessible page begins (64-byte aligned
    when ``n_floats`` is a multiple of 16)."""
    import mmap

    page = mmap.PAGESIZE
    nbytes = n_floats * 4
    pages = -(-nbytes // page) + 1
    region = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    guard = base + (pages - 1) * page
    assert libc.mprotect(guard, page, 0) == 0
    start = guard - nbytes
    array = np.ctypeslib.as_array((ctypes.c_float * n_floats).from_address(start))
    return region, array


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_guarded_loads_never_touch_memory_past_the_end(tmp_path):
    """select(i < n, A[i...], 0) with a vector tail and with scalars must not read past A."""
    n, lanes, total = 80, 64, 128  # 2 vectors of 64: the second reaches 48 floats past A
    A, B, S = ir.Buffer("A", (n,)), ir.Buffer("B", (total,)), ir.Buffer("S", (total,))
    G = ir.Buffer("G", (64,))
    x, y, limit = E.Var("x"), E.Var("y"), E.Var("limit")  # limit = n, unknown to LLVM
    ramp = vec(x * lanes, lanes)
    vector = ir.For(x, c(0), c(2), "serial", ir.Store(B, E.Select(
        ir.Ramp(x * lanes, c(1), lanes) < ir.Broadcast(limit, lanes), ir.Load(A, ramp),
        ir.Broadcast(c(-1.0), lanes)), ramp))
    scalar = ir.For(y, c(0), c(total), "serial", ir.Store(S, E.Select(
        y < limit, ir.Load(A, y), c(-1.0)), y))
    strided = ir.Ramp(x * 32, c(2), 16)  # a gather: elements 0, 2, ..., 126
    gather = ir.For(x, c(0), c(4), "serial", ir.Store(G, E.Select(
        strided < ir.Broadcast(limit, 16), ir.Load(A, strided), ir.Broadcast(c(-1.0), 16)),
        vec(x * 16, 16)))
    f = ir.PrimFunc("guarded", [A, B, S, G, limit], ir.seq(vector, scalar, gather))
    # a baseline x86-64 cpu: AVX-512 would hide unmasked reads by folding them into masked moves
    path = build(f, target="llvm -mcpu=x86-64").export_library(tmp_path / "guarded.so")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            region, a = _guarded_array(n)
            a[:] = np.arange(n, dtype="float32")
            b, s = (aligned_copy(np.zeros(total, "float32")) for _ in range(2))
            g = aligned_copy(np.zeros(64, "float32"))
            lib = ctypes.CDLL(str(path))
            limit = ctypes.c_int64(n)
            argv = (ctypes.c_void_p * 5)(a.ctypes.data, b.ctypes.data, s.ctypes.data,
                                         g.ctypes.data, ctypes.addressof(limit))
            expect = np.concatenate([np.arange(n), np.full(total - n, -1)]).astype("float32")
            if lib.__kernelrpc_fn_guarded(argv) == 0 and (b == expect).all() \
                    and (s == expect).all() and (g == expect[::2]).all():
                code = 0
            del region
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the kernel read past the end of A"


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("target, dtype, fast", [
    ("llvm -mcpu=x86-64", "uint8", True), ("llvm -mcpu=x86-64", "float32", False),
    ("llvm -mcpu=haswell", "int16", True), ("llvm -mcpu=haswell", "float32", False),
    ("llvm -mtriple=aarch64-linux-gnu", "uint8", True)])
def test_in_bounds_loads_match_the_masked_loads(tmp_path, monkeypatch, target, dtype, fast,
                                                stride):
    """A contiguous (or strided: its contiguous parts) load of bytes or 16-bit elements under
    a mask, on a target without a masked load of them: one plain load where the vector lies
    inside the buffer, the masked load at its ends (the first vector starts before the buffer,
    the last ends past it); either way the lanes the mask keeps, as the masked loads alone read
    them. Floats keep the masked load (one instruction on AVX2)."""
    from kernelrpc.compiler.codegen import memory_codegen

    n, lanes, vectors = 100, 16, 9
    A, B = ir.Buffer("A", (n,), dtype), ir.Buffer("B", (vectors * lanes,), dtype)
    x = E.Var("x")
    index = ir.Ramp(x * 12 - 8, c(stride), lanes)
    inside = E.logical_and(index >= ir.Broadcast(c(0), lanes), index < ir.Broadcast(c(n), lanes))
    body = ir.For(x, c(0), c(vectors), "serial", ir.Store(B, E.Select(
        inside, ir.Load(A, index), ir.Broadcast(c(200, dtype), lanes)), vec(x * lanes, lanes)))
    f = ir.PrimFunc("windows", [A, B], body)
    a = (np.arange(n) % 120 + 1).astype(dtype)
    at = np.arange(vectors)[:, None] * 12 - 8 + np.arange(lanes) * stride
    expect = np.where((at >= 0) & (at < n), a[np.clip(at, 0, n - 1)], 200).astype(dtype).ravel()
    for enabled in (True, False):
        monkeypatch.setattr(memory_codegen, "IN_BOUNDS_LOADS", enabled)
        module = build(f, target=target)
        assert ("ld.whole" in module.get_source("ll")) == (enabled and fast)
        if target.endswith("aarch64-linux-gnu"):
            continue            # the emulated boards' tests run aarch64 code
        _, got = run(f, a, np.zeros(vectors * lanes, dtype), tmp_path=tmp_path,
                     name=f"windows_{enabled}_{stride}")
        np.testing.assert_array_equal(got, expect)


def _strided_copy(stride: int, lanes: int, dtype: str, masked: bool, end_on_last_lane=False):
    """``B[x*lanes + k] = A[x*stride*lanes + k*stride]`` (under ``masked``: lanes whose element
    is at or past ``limit`` give -1), ``x`` over 3 vectors; ``end_on_last_lane``: ``A`` ends
    on the last lane's element."""
    n = 3 * stride * lanes - (stride - 1 if end_on_last_lane else 0)
    A, B = ir.Buffer("A", (n,), dtype), ir.Buffer("B", (3 * lanes,), dtype)
    x, limit = E.Var("x"), E.Var("limit")
    index = ir.Ramp(x * (stride * lanes), c(stride), lanes)
    value = ir.Load(A, index)
    if masked:
        value = E.Select(index < ir.Broadcast(limit, lanes), value,
                         ir.Broadcast(c(-1, dtype), lanes))
    body = ir.For(x, c(0), c(3), "serial", ir.Store(B, value, vec(x * lanes, lanes)))
    return ir.PrimFunc("strided", [A, B, limit], body), n


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("stride, lanes, dtype", [
    (2, 16, "float32"), (2, 9, "float32"), (3, 8, "float32"), (4, 4, "float32"),
    (2, 8, "float64"), (3, 16, "int8"), (2, 4, "int32"), (4, 16, "float32")])
def test_strided_loads_match_the_lane_by_lane_path(tmp_path, monkeypatch, stride, lanes, dtype,
                                                   masked):
    """A constant-stride vector load (contiguous loads and a shuffle) computes what the general
    lane-by-lane path computes, masked and not, and the fast path is what the module holds."""
    from kernelrpc.compiler.codegen import memory_codegen

    f, n = _strided_copy(stride, lanes, dtype, masked)
    a = (np.arange(n) % 97 - 40).astype(dtype)
    limit = n - stride * lanes // 2
    expect = a[::stride].copy()
    if masked:
        expect[np.arange(0, n, stride) >= limit] = -1
    outputs = {}
    for fast in (True, False):
        monkeypatch.setattr(memory_codegen, "STRIDED_LOADS", fast)
        text = build(f).get_source("ll")
        picks = (rf"shufflevector <\d+ x \w+> %\S+, <\d+ x \w+> poison, <{lanes} x i32> "
                 rf"<i32 0, i32 {stride},")
        assert (re.search(picks, text) is not None) == fast
        _, outputs[fast] = run(f, a, np.zeros(3 * lanes), limit, tmp_path=tmp_path,
                               name=f"strided_{fast}")
    np.testing.assert_array_equal(outputs[True], expect)
    np.testing.assert_array_equal(outputs[False], outputs[True])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("stride", [2, 3, 4])
def test_strided_loads_never_read_past_their_last_lane(tmp_path, stride):
    """The last vector's last lane is the buffer's last element, against an inaccessible page:
    the contiguous loads stay within the lanes' span."""
    lanes = 16
    f, n = _strided_copy(stride, lanes, "float32", masked=False, end_on_last_lane=True)
    path = build(f, target="llvm -mcpu=x86-64").export_library(tmp_path / "strided.so")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            region, a = _guarded_array(n)
            a[:] = np.arange(n, dtype="float32")
            b = aligned_copy(np.zeros(3 * lanes, "float32"))
            limit = ctypes.c_int64(n)
            argv = (ctypes.c_void_p * 3)(a.ctypes.data, b.ctypes.data, ctypes.addressof(limit))
            if ctypes.CDLL(str(path)).__kernelrpc_fn_strided(argv) == 0 and \
                    (b == np.arange(0, n, stride)).all():
                code = 0
            del region
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the kernel read past the end of A"
