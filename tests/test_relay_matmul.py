"""Matrix products with many rows (attention's batched MatMul, a dense layer over a sequence's
tokens): every register tile the knobs offer computes numpy's product, on ragged shapes and
broadcast batches, on every vector width."""
import numpy as np
import pytest

import kernelrpc
from kernelrpc import autotvm, nd, relay
from kernelrpc.contrib import graph_executor
from kernelrpc.relay import ir, strategy, tuning
from kernelrpc.compiler.target import Target
from kernelrpc.relay.errors import ModelError
from kernelrpc.relay.fuse import Group
from kernelrpc.relay.op import OPS
from kernelrpc.relay.op.weight_layout import WeightLayout
from kernelrpc.relay.schedule import group_tensors, schedule_group
from target_families import family_params


def _matmul_group(a_shape, b_shape):
    a = ir.Node("input", (), {}, a_shape, "float32", "a")
    b = ir.Node("input", (), {}, b_shape, "float32", "b")
    shape, dtype = OPS["nn.batch_matmul"].infer([a, b], {})
    node = ir.Node("nn.batch_matmul", (a, b), {}, tuple(shape), dtype, "matmul")
    return Group(nodes=[node], anchor=node)


def _configs(space):
    """The default, and each knob's every value with the others at their default."""
    default = space.get(0).to_dict()
    found = [default]
    for name, knob in space.space_map.items():
        found += [{**default, name: e.val} for e in knob.entities[1:]]
    return [space.from_values(values) for values in found]


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("a_shape, b_shape", [((4, 37, 16), (4, 16, 29)),
                                              ((2, 1, 9, 7), (3, 7, 33)),
                                              ((1, 3, 5), (5, 4))])
def test_every_batched_matmul_tile_computes_the_product(a_shape, b_shape, target):
    group = _matmul_group(a_shape, b_shape)
    tiles = strategy.tiles_for(target)
    space = autotvm.ConfigSpace()
    strategy.define_knobs(space, tiles, group.anchor, padded=False)
    assert set(space.space_map) == {"tile_m", "tile_n"}
    rng = np.random.default_rng(0)
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    expect = np.matmul(a.astype(np.float64), b.astype(np.float64))
    for config in _configs(space):
        placeholders, out, anchor = group_tensors(group)
        s = schedule_group(group, out, anchor, tiles, config)
        lib = kernelrpc.build(s, [*placeholders, out], target=target)
        got = nd.empty(expect.shape, "float32")
        lib[lib.metadata["functions"][0]["name"]](nd.array(a), nd.array(b), got)
        np.testing.assert_allclose(got.numpy(), expect, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{config} {target}")


@pytest.mark.parametrize("target", family_params())
def test_every_dense_tile_over_many_rows_computes_the_product(target):
    """Rows enough for the ``tile`` order (its default, reading the weight in panels, the
    task's second weight argument), a ragged row and column count (the last panel padded)."""
    task = tuning.task_of(("dense", [19, 24], [24, 45], [], "float32", str(target)), flop=1.0)
    space = task.config_space
    assert space.space_map["order"].entities[0].val == "tile"
    assert [e.val for e in space.space_map["weight_panel"].entities] == [True, False]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((19, 24)).astype("float32")
    w = rng.standard_normal((24, 45)).astype("float32")
    inputs = task.prepare_inputs([x, w])
    panel = strategy.matmul_tile(strategy.tiles_for(target))[1]
    assert inputs[2].shape == (-(-45 // panel), 24, panel)
    for config in _configs(space):
        s, args = task.instantiate(config)
        lib = kernelrpc.build(s, args, target=target)
        out = nd.empty((19, 45), "float32")
        lib[lib.metadata["functions"][0]["name"]](*map(nd.array, inputs), out)
        np.testing.assert_allclose(out.numpy(), task.reference(x, w), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{config} {target}")


def test_the_panels_layout_holds_the_weight_and_says_so():
    """``[N/P][K][P]`` with the last panel padded by zero columns, its attribute read back,
    and a dense node refuses a weight that does not fit its layout."""
    w = np.arange(5 * 7, dtype="float32").reshape(5, 7)
    layout = WeightLayout.panels(4, 7)
    packed = layout.transform(w)
    assert packed.shape == layout.shape(w.shape) == (2, 5, 4)
    assert layout.model_shape(packed.shape) == [5, 7]
    assert np.array_equal(packed[1, :, 3], np.zeros(5)) and packed[1, 2, 1] == w[2, 5]
    assert WeightLayout.parse(layout.attr) == layout
    x = ir.Node("input", (), {}, (3, 5), "float32", "x")
    fits = ir.Node("input", (), {}, (2, 5, 4), "float32", "w")
    assert OPS["nn.dense"].infer([x, fits], {"kernel_layout": layout.attr})[0] == (3, 7)
    short = ir.Node("input", (), {}, (1, 5, 4), "float32", "w")
    with pytest.raises(ModelError, match="do not multiply"):
        OPS["nn.dense"].infer([x, short], {"kernel_layout": layout.attr})
    with pytest.raises(ModelError, match="convolution's"):
        OPS["nn.dense"].infer([x, fits], {"kernel_layout": "OIHW8o"})
    with pytest.raises(ModelError, match="unknown kernel_layout"):
        WeightLayout.parse("KN_panels999_7")


def test_a_network_lays_the_dense_weight_out_in_panels_once():
    """``relay.build`` puts a dense layer's constant weight in panels where its configuration
    reads them (the default over many rows, not for one row), and the output is numpy's."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 50)).astype("float32")
    panel = strategy.matmul_tile(strategy.tiles_for(Target("llvm")))[1]
    for rows, weight_shape in ((21, (-(-50 // panel), 40, panel)), (1, (40, 50))):
        x = ir.Node("input", (), {}, (rows, 40), "float32", "x")
        shape, dtype = OPS["nn.dense"].infer([x, ir.const(w, "w")], {})
        node = ir.Node("nn.dense", (x, ir.const(w, "w")), {}, tuple(shape), dtype, "y")
        lib = relay.build(ir.IRModule(ir.Function([x], [node])), target="llvm")
        assert [p.shape for p in lib.get_params().values()] == [weight_shape]
        data = rng.standard_normal((rows, 40)).astype("float32")
        g = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
        g.set_input(x=data)
        g.run()
        np.testing.assert_allclose(g.get_output(0).numpy(), data.astype(np.float64) @ w,
                                   rtol=1e-4, atol=1e-4)
