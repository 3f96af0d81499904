"""Matrix products with many rows (attention's batched MatMul, a dense layer over a sequence's
tokens): every register tile the knobs offer computes numpy's product, on ragged shapes and
broadcast batches, on every vector width."""
import numpy as np
import pytest

import kernelrpc
from kernelrpc import autotvm, nd
from kernelrpc.relay import ir, strategy, tuning
from kernelrpc.relay.fuse import Group
from kernelrpc.relay.op import OPS
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
    """Rows enough for the ``tile`` order (its default, reading the weight's panels copied
    by default), a ragged row and column count."""
    task = tuning.task_of(("dense", [19, 24], [24, 45], [], "float32", str(target)), flop=1.0)
    space = task.config_space
    assert space.space_map["order"].entities[0].val == "tile"
    assert [e.val for e in space.space_map["weight_panel"].entities] == [True, False]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((19, 24)).astype("float32")
    w = rng.standard_normal((24, 45)).astype("float32")
    for config in _configs(space):
        s, args = task.instantiate(config)
        lib = kernelrpc.build(s, args, target=target)
        out = nd.empty((19, 45), "float32")
        lib[lib.metadata["functions"][0]["name"]](nd.array(x), nd.array(w), out)
        np.testing.assert_allclose(out.numpy(), task.reference(x, w), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{config} {target}")
