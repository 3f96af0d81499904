"""Loop unswitching: a guard the innermost loop does not change is tested once, outside it."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import kernelrpc
from kernelrpc import relay, te
from kernelrpc.compiler import interp, ir
from kernelrpc.compiler.expr import LT, IntImm, Var
from kernelrpc.compiler.lower.unswitch import unswitch_func
from kernelrpc.contrib import graph_executor


def _guarded_sum(condition_of):
    """``out[0] += a[k]`` and, where ``condition_of(k, n)`` holds, ``out[1] += a[k]``, for k
    in [0, 8)."""
    a, out = ir.Buffer("a", (8,)), ir.Buffer("out", (2,))
    k, n = Var("k"), Var("n")
    first = ir.Store(out, ir.Load(out, IntImm(0)) + ir.Load(a, k), IntImm(0))
    second = ir.Store(out, ir.Load(out, IntImm(1)) + ir.Load(a, k), IntImm(1))
    body = ir.seq(first, ir.IfThenElse(condition_of(k, n, a), second))
    loop = ir.For(k, IntImm(0), IntImm(8), "serial", body)
    return ir.PrimFunc("guarded", [a, out, n], loop)


def _run(func, n):
    a = np.arange(1, 9, dtype="float32")
    out = np.zeros(func.params[1].shape, "float32")
    interp.run(func, a, out, n)
    return out


def _loops(node):
    found = []
    ir.post_order_visit(node, lambda x: found.append(x) if isinstance(x, ir.For) else None)
    return found


def _guards_in(node):
    found = []
    ir.post_order_visit(node, lambda x: found.append(x) if isinstance(x, ir.IfThenElse) else None)
    return found


def test_an_invariant_guard_is_tested_once_outside_two_loops():
    func = _guarded_sum(lambda k, n, a: LT(n, IntImm(3)))
    unswitched = unswitch_func(func)
    body = unswitched.body
    assert isinstance(body, ir.IfThenElse)
    assert [len(_guards_in(loop.body)) for loop in _loops(body)] == [0, 0]
    for n in (0, 2, 3, 7):
        np.testing.assert_array_equal(_run(unswitched, n), _run(func, n))
    assert _run(unswitched, 0).tolist() == [36.0, 36.0]
    assert _run(unswitched, 5).tolist() == [36.0, 0.0]


def test_the_guard_leaves_the_whole_nest_of_serial_loops():
    """``for j: for k: if n < 3: ...``: the guard is tested once, outside both loops."""
    a, out = ir.Buffer("a", (8,)), ir.Buffer("out", (2,))
    j, k, n = Var("j"), Var("k"), Var("n")
    guarded = ir.IfThenElse(LT(n, IntImm(3)), ir.Store(
        out, ir.Load(out, IntImm(1)) + ir.Load(a, k), IntImm(1)))
    inner = ir.For(k, IntImm(0), IntImm(4), "serial", ir.seq(
        ir.Store(out, ir.Load(out, IntImm(0)) + ir.Load(a, j * IntImm(4) + k), IntImm(0)),
        guarded))
    func = ir.PrimFunc("nest", [a, out, n], ir.For(j, IntImm(0), IntImm(2), "serial", inner))
    unswitched = unswitch_func(func)
    assert isinstance(unswitched.body, ir.IfThenElse)
    assert all(isinstance(case, ir.For) and not _guards_in(case)
               for case in (unswitched.body.then_case, unswitched.body.else_case))
    for value in (2, 3):
        np.testing.assert_array_equal(_run(unswitched, value), _run(func, value))


def test_a_tiles_row_guards_are_one_condition():
    """``n*6 < 126``, ``< 125`` and ``< 124`` hold for the same integers: one unswitch."""
    a, out = ir.Buffer("a", (8,)), ir.Buffer("out", (3,))
    k, n = Var("k"), Var("n")
    rows = [ir.IfThenElse(LT(n * IntImm(6), IntImm(126 - r)),
                          ir.Store(out, ir.Load(out, IntImm(r)) + ir.Load(a, k), IntImm(r)))
            for r in range(3)]
    func = ir.PrimFunc("rows", [a, out, n], ir.For(k, IntImm(0), IntImm(8), "serial",
                                                     ir.seq(*rows)))
    unswitched = unswitch_func(func)
    assert isinstance(unswitched.body, ir.IfThenElse)
    assert [len(_guards_in(loop.body)) for loop in _loops(unswitched.body)] == [0]
    for value in (19, 20, 21):
        np.testing.assert_array_equal(_run(unswitched, value), _run(func, value))
    assert _run(unswitched, 20).tolist() == [36.0] * 3
    assert _run(unswitched, 21).tolist() == [0.0] * 3


def test_guards_the_loop_changes_or_that_read_memory_stay_inside():
    on_the_loop = _guarded_sum(lambda k, n, a: LT(k, n))
    reads = _guarded_sum(lambda k, n, a: LT(ir.Load(a, IntImm(0)), ir.Load(a, IntImm(1))))
    for func in (on_the_loop, reads):
        assert unswitch_func(func).body is func.body


def _attention_product(rows: int, depth: int, columns: int):
    """ONNX MatMul of 4 heads: ``[1, 4, rows, depth] x [1, 4, depth, columns]``."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, (1, 4, rows, depth))
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, (1, 4, depth, columns))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 4, rows, columns))
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "attention",
                              [a, b], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_matmul_whose_last_row_tile_is_short_keeps_its_guard_out_of_the_reduction():
    """197 rows in tiles of the target's rows: the last tile's short rows are guarded by the
    fused parallel loop's index, which LoopPartition cannot split; no guard is left in a loop
    over the reduction, and the product is numpy's."""
    model = _attention_product(197, 197, 64)
    mod, params = relay.frontend.from_onnx(model)
    for target in ("llvm -mcpu=haswell", "llvm -mcpu=x86-64"):
        lib = relay.build(mod, target=target, params=params)
        lowered = lib.lib.get_source("lowered")
        assert "if (" in lowered
        for loop in lowered.split("for (k: int32, 0, 197)")[1:]:
            assert "if (" not in loop.split("}")[0], target
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 4, 197, 197)).astype("float32")
    b = rng.standard_normal((1, 4, 197, 64)).astype("float32")
    outputs = []
    for disabled in ((), ("UnswitchLoop",)):
        with te.PassContext(disabled_pass=disabled):
            lib = relay.build(mod, target="llvm", params=params)
        module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
        module.set_input(a=a, b=b)
        module.run()
        outputs.append(module.get_output(0).numpy())
    np.testing.assert_allclose(outputs[0], a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(outputs[0], outputs[1])      # the general path's, bitwise
