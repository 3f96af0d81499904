"""The grouped convolution's ``grouped`` layout (each group's output channels in whole vectors,
the last padded with zero weights): every knob value computes the convolution on every vector
width, in a network (laid-out weight, the group's tail) and as a tuning task (the OIHW
argument and its laid-out copy); where it is not offered the knob has the columns layout
alone."""
import numpy as np
import pytest

pytest.importorskip("onnx")

from kernelrpc import autotvm, relay, te  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.relay import ir, strategy  # noqa: E402
from kernelrpc.relay.errors import ModelError  # noqa: E402
from kernelrpc.relay.op import OPS  # noqa: E402
from kernelrpc.relay.op.reference import conv2d_reference  # noqa: E402
from kernelrpc.relay.op.weight_layout import WeightLayout  # noqa: E402
from target_families import family_params  # noqa: E402
from test_relay_conv_channels import Knobs, config_of, conv_layer, conv_node, conv_task, run, \
    run_task  # noqa: E402

RNG = np.random.default_rng(5)

#: ShuffleNet's 1x1 layer (34 of a group's channels: 40 or 48 lanes) with a residual tail; a
#: padded, strided 3x3 one (ResNeXt's kind, 12 channels a group) on odd maps
CASES = {
    "1x1 shufflenet": dict(x=(1, 68, 14, 14), w=(136, 17, 1, 1), group=4, residual=True),
    "3x3 strided": dict(x=(1, 24, 15, 13), w=(36, 8, 3, 3), group=3, strides=(2, 2),
                        pads=(1, 1, 1, 1)),
}


def _check(mod, params, feeds, expect, target, knobs):
    with Knobs(layout="grouped", **knobs):
        lib = relay.build(mod, target=target, params=params)
    (record,) = [k for k in lib.executor["kernels"] if k.get("workload")]
    assert record["config"]["layout"] == "grouped"
    assert [p.ndim for p in lib.get_params().values()].count(5) == 1
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                               atol=1e-4 * np.abs(expect).max(), err_msg=f"{knobs}, {target}")


@pytest.mark.parametrize("target", family_params())
def test_every_grouped_knob_computes_the_convolution(target):
    """Every register tile on the 1x1 layer; every value of the knobs it shares with the
    direct strategy (reduction order, window columns unrolled, padded input's stage) on the
    3x3 one."""
    mod, params, feeds, expect, conv = conv_layer(**CASES["1x1 shufflenet"])
    tiles = strategy.group_tiles(strategy.tiles_for(target), conv)
    assert tiles
    for tile in tiles:
        _check(mod, params, feeds, expect, target, {"group_tile": tile})
    mod, params, feeds, expect, conv = conv_layer(**CASES["3x3 strided"])
    tile = strategy.group_tiles(strategy.tiles_for(target), conv)[0]
    for knobs in ({"reduce_order": "window_outer"}, {"unroll_kw": True}, {"pad": "inline"},
                  {"reduce_order": "channels_outer", "unroll_kw": False, "pad": "stage"}):
        _check(mod, params, feeds, expect, target, {"group_tile": tile, **knobs})


@pytest.mark.parametrize("target", family_params())
def test_one_group_of_channels_that_vectors_do_not_fill(target):
    """A classifier's convolution to 1000 channels (a multiple of 8, not of 16): on 16-lane
    targets the ``grouped`` layout with one group, its last vector padded, is offered and the
    default after the pointwise ``pixels`` strategy, and every tile computes the convolution;
    elsewhere the ``channels`` layout has it."""
    mod, params, feeds, expect, conv = conv_layer(x=(1, 40, 13, 13), w=(1000, 40, 1, 1))
    tiles = strategy.tiles_for(target)
    found = strategy.group_tiles(tiles, conv)
    if tiles.lanes == 16:
        names = [c.name for c in strategy.conv2d.candidates(tiles, conv)]
        assert found and names[:2] == ["pixels", "grouped"]
        for tile in found:
            _check(mod, params, feeds, expect, target, {"group_tile": tile})
    else:
        assert not found


def test_weight_layout_pads_each_group():
    """Each group's channels start a vector; the lanes past them hold zero weights; the layout
    survives its attribute and gives back the OIHW shape."""
    weight = RNG.standard_normal((12, 2, 3, 3)).astype("float32")
    layout = WeightLayout.grouped(4, 2, 12)
    packed = layout.transform(weight)
    assert packed.shape == layout.shape(weight.shape) == (4, 2, 3, 3, 4)
    assert WeightLayout.parse(layout.attr) == layout
    assert layout.model_shape(packed.shape) == [12, 2, 3, 3]
    np.testing.assert_array_equal(packed[1, :, :, :, :2], weight[4:6].transpose(1, 2, 3, 0))
    np.testing.assert_array_equal(packed[1, :, :, :, 2:], 0)
    np.testing.assert_array_equal(packed[2, :, :, :, 0], weight[6])


def test_a_layout_that_does_not_fit_the_layer_is_refused():
    node = conv_node((1, 8, 5, 5), (12, 4, 1, 1), groups=2)
    wrong = WeightLayout.grouped(4, 3, 12)
    laid = ir.Node("input", (), {}, wrong.shape((12, 4, 1, 1)), "float32", "w")
    node = ir.Node(node.op, (node.inputs[0], laid), {**node.attrs, "kernel_layout": wrong.attr},
                   node.shape, node.dtype)
    with pytest.raises(ModelError, match="does not fit"):
        OPS["nn.conv2d"].compute([te.placeholder(node.inputs[0].shape, name="x"),
                                  te.placeholder(laid.shape, name="w")], node.attrs, node)


@pytest.mark.parametrize("weight, groups, target, expect", [
    ((136, 34, 1, 1), 4, "llvm -mcpu=haswell", ["grouped", "columns"]),
    ((136, 34, 1, 1), 4, "llvm -mcpu=skylake-avx512", ["grouped", "columns"]),
    ((112, 28, 1, 1), 4, "llvm -mcpu=haswell", ["grouped", "columns"]),
    ((112, 28, 1, 1), 4, "llvm -mcpu=skylake-avx512", ["columns", "grouped"]),
    ((112, 6, 1, 1), 4, "llvm -mcpu=haswell", ["columns", "grouped"]),
    ((18, 8, 3, 3), 2, "llvm -mcpu=haswell", ["columns"]),        # 9 channels in 16 lanes
    ((16, 1, 3, 3), 16, "llvm -mcpu=haswell", None),               # depthwise: its own
    ((32, 8, 1, 1), 2, "llvm -mtriple=riscv64-linux-gnu", ["columns"]),   # scalar
])
def test_layout_knob_offers_grouped_where_it_pays(weight, groups, target, expect):
    """Default for a group's reduction of at least two vectors (the examples are ShuffleNet's
    layers); not offered where padding would waste more than a third of the lanes."""
    node = conv_node((1, weight[1] * groups, 14, 14), weight, groups=groups)
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, strategy.tiles_for(Target(target)), node, padded=False)
    layouts = space.space_map.get("layout")
    assert ([e.val for e in layouts.entities] if layouts else None) == expect
    assert ("group_tile" in space.space_map) == bool(expect and "grouped" in expect)


def test_tuning_task_takes_the_weight_and_its_grouped_copy():
    """The task's arguments are the OIHW weight and its grouped copy: a columns configuration
    reads the one, every grouped one the other, each agreeing with numpy."""
    target = Target("llvm -mcpu=haswell")
    data, weight = [1, 12, 9, 9], [36, 4, 3, 3]
    attrs = {"dilation": [1, 1], "groups": 3, "padding": [1, 1, 1, 1], "strides": [1, 1]}
    task = conv_task(data, weight, attrs, target)
    layout = WeightLayout.grouped(8, 3, 36)
    assert [spec[0] for spec in task.arg_specs[:3]] == [
        tuple(data), tuple(weight), layout.shape(weight)]
    inputs = task.prepare_inputs([RNG.standard_normal(shape).astype(dtype)
                                  for shape, dtype in task.arg_specs[:3]])
    np.testing.assert_array_equal(inputs[2], layout.transform(inputs[1]))
    expect = conv2d_reference(inputs[0], inputs[1], strides=(1, 1), padding=(1, 1, 1, 1),
                              dilation=(1, 1), groups=3)
    space = task.config_space
    configs = [config_of(space, layout="columns")]
    configs += [config_of(space, layout="grouped", group_tile=tile.val)
                for tile in space.space_map["group_tile"].entities]
    assert {c["layout"].val for c in configs} == {"columns", "grouped"}
    for config in configs:
        np.testing.assert_allclose(run_task(task, config, inputs, target), expect, rtol=1e-4,
                                   atol=1e-4, err_msg=str(config))
        np.testing.assert_allclose(task.reference(*inputs), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.cross
def test_grouped_layers_on_an_emulated_aarch64_board(tmp_path):
    """4-lane NEON code: both layers take the grouped layout by default and agree with numpy
    on the board."""
    from servicectl import Service
    from test_relay_emulated import board_session, run_checked

    tracker = Service("kernelrpc.tracker", ["--port", "0"])
    try:
        with board_session(tracker, "aarch64") as remote:
            target = remote.target()
            for case in CASES:
                mod, params, feeds, expect, _ = conv_layer(**CASES[case])
                lib = relay.build(mod, target=target, params=params)
                assert [p.ndim for p in lib.get_params().values()].count(5) == 1, case
                run_checked(remote, lib, tmp_path / f"grouped{len(case)}.so", feeds, expect,
                            f"{case} on aarch64")
    finally:
        tracker.stop()
