"""The convolution's ``channels`` layout (output channels in the vector, the weight packed once
by relay.build): every tile it offers computes the convolution, in a network (packed weight,
the group's tail) and as a tuning task (the OIHW argument packed in the kernel); where it is
not offered (grouped: see test_relay_conv_grouped.py; depthwise, channels not a multiple of
the lanes, a scalar target) the knob has the columns layout alone."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import autotvm, nd, relay  # noqa: E402
from kernelrpc.autotvm.task import DispatchContext  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import ir, strategy, tuning  # noqa: E402
from kernelrpc.relay.op import OPS  # noqa: E402
from kernelrpc.relay.op.reference import conv2d_reference  # noqa: E402
from kernelrpc.relay.op.weight_layout import WeightLayout  # noqa: E402
from target_families import family_params  # noqa: E402

TARGET = Target(None)
RNG = np.random.default_rng(3)


class Knobs(DispatchContext):
    """Every convolution gets the default configuration with ``values`` in place."""

    def __init__(self, **values):
        self.values = values

    def query(self, template, args, quiet=False):
        space = autotvm.task.create(template.name, args).config_space
        knobs = {**space.get(0).to_dict(), **self.values}
        return space.from_values(knobs)


def conv_model(x, w, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1,
               residual=False):
    """Conv + bias + relu (+ a residual input added), its inputs and numpy's answer."""
    weight = RNG.standard_normal(w).astype("float32")
    bias = RNG.standard_normal(w[0]).astype("float32")
    data = RNG.standard_normal(x).astype("float32")
    attrs = dict(strides=list(strides), pads=list(pads), dilations=list(dilations), group=group)
    expect = conv2d_reference(data, weight, strides=strides, dilation=dilations,
                                     groups=group, padding=(pads[0], pads[1], pads[2], pads[3]))
    expect = np.maximum(expect + bias.reshape(1, -1, 1, 1), 0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Relu", ["c"], ["r" if residual else "y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)]
    feeds = {"x": data}
    if residual:
        feeds["s"] = RNG.standard_normal(expect.shape).astype("float32")
        expect = expect + feeds["s"]
        nodes.append(helper.make_node("Add", ["r", "s"], ["y"]))
        inputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, expect.shape))
    graph = helper.make_graph(nodes, "conv", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w"),
                               numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, feeds, expect


def conv_layer(*args, **kwargs):
    """:func:`conv_model`'s network imported: ``(mod, params, feeds, expect, conv)``, ``conv``
    its convolution node."""
    model, feeds, expect = conv_model(*args, **kwargs)
    mod, params = relay.frontend.from_onnx(model)
    conv = next(n for n in mod["main"].topo() if n.op == "nn.conv2d")
    return mod, params, feeds, expect, conv


def run(lib, feeds):
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**feeds)
    m.run()
    return m.get_output(0).numpy()


def conv_node(data, weight, groups=1, strides=(1, 1)):
    x = ir.Node("input", (), {}, tuple(data), "float32", "x")
    w = ir.Node("input", (), {}, tuple(weight), "float32", "w")
    attrs = {"strides": strides, "dilation": (1, 1), "padding": (0, 0, 0, 0), "groups": groups}
    shape, dtype = OPS["nn.conv2d"].infer([x, w], attrs)
    return ir.Node("nn.conv2d", (x, w), attrs, tuple(shape), dtype, "conv")


CASES = {
    "1x1": dict(x=(1, 24, 7, 7), w=(32, 24, 1, 1)),
    "1x1 residual": dict(x=(2, 20, 6, 10), w=(16, 20, 1, 1), residual=True),
    "3x3 padded": dict(x=(1, 4, 14, 14), w=(32, 4, 3, 3), pads=(1, 1, 1, 1)),   # not Winograd
    "3x3 strided": dict(x=(1, 8, 15, 13), w=(16, 8, 3, 3), strides=(2, 2), pads=(1, 0, 2, 1)),
    "1x1 strided": dict(x=(1, 16, 14, 14), w=(48, 16, 1, 1), strides=(2, 2)),
    "3x3 dilated": dict(x=(1, 4, 12, 9), w=(16, 4, 3, 3), dilations=(2, 2), pads=(2, 2, 2, 2)),
}


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_channel_tile_computes_the_convolution_in_a_network(case, target):
    mod, params, feeds, expect, conv = conv_layer(**CASES[case])
    tiles = strategy.channel_tiles(strategy.tiles_for(target), conv)
    if strategy.tiles_for(target).lanes == 1:
        assert tiles == []
        pytest.skip("the channels layout is not offered on a scalar target")
    assert tiles, "the layout should be offered for this shape"
    for tile in tiles:
        with Knobs(layout="channels", channel_tile=tile):
            lib = relay.build(mod, target=target, params=params)
        (record,) = lib.executor["kernels"]
        assert record["config"]["layout"] == "channels" and record["workload"][2] == \
            list(CASES[case]["w"])
        packed = [p for p in lib.get_params().values() if p.ndim == 5]
        assert len(packed) == 1 and packed[0].shape[-1] == strategy.tiles_for(target).lanes
        got = run(lib, feeds)
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * np.abs(expect).max(),
                                   err_msg=f"{case}, tile {tile}, {target}")
    with Knobs(layout="columns"):
        lib = relay.build(mod, target=target, params=params)
    assert all(p.ndim == 4 for p in lib.get_params().values() if p.ndim > 1)
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                               atol=1e-4 * np.abs(expect).max())


def test_channels_layout_on_fewer_lanes():
    """AVX2 (8 lanes, 16 registers): the tiles fit its registers, and compute the same."""
    target = Target("llvm -mcpu=haswell")
    tiles = strategy.tiles_for(target)
    assert tiles.lanes == 8
    mod, params, feeds, expect, conv = conv_layer(**CASES["3x3 padded"])
    choices = strategy.channel_tiles(tiles, conv)
    assert choices and all(
        int(v) * int(r) * int(c) + int(v) + (1 if v == "1" else 3 + int(r) * int(c)) <= 16
        for v, r, c in (t.split("x") for t in choices))
    for tile in choices[:3]:
        with Knobs(layout="channels", channel_tile=tile):
            lib = relay.build(mod, target=target, params=params)
        np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                                   atol=1e-4 * np.abs(expect).max(), err_msg=tile)


@pytest.mark.parametrize("data, weight, attrs, target, layouts", [
    ((1, 16, 7, 7), (18, 8, 3, 3), dict(groups=2), "llvm -mcpu=haswell",   # grouped, 9 a group
     ["columns"]),
    ((1, 16, 7, 7), (24, 16, 1, 1), {}, "llvm -mcpu=skylake-avx512",       # 24 channels, 16
     ["columns", "grouped", "pixels"]),              # lanes: one group padded to 32 instead
    ((1, 16, 7, 7), (32, 16, 1, 1), {}, "llvm -mtriple=riscv64-linux-gnu",  # scalar target
     ["columns", "pixels"]),
])
def test_channels_layout_not_offered(data, weight, attrs, target, layouts):
    node = conv_node(data, weight, **attrs)
    tiles = strategy.tiles_for(Target(target))
    assert strategy.channel_tiles(tiles, node) == []
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, node, padded=True)
    assert [e.val for e in space.space_map["layout"].entities] == layouts
    assert "channel_tile" not in space.space_map


@pytest.mark.parametrize("target, data, weight, strides, first", [
    ("llvm -mcpu=haswell", (1, 128, 57, 57), (128, 128, 3, 3), (2, 2), "2x1x4"),
    ("llvm -mcpu=haswell", (1, 256, 29, 29), (256, 256, 3, 3), (2, 2), "2x2x2"),
    ("llvm -mcpu=haswell", (1, 512, 15, 15), (512, 512, 3, 3), (2, 2), "1x2x7"),
    ("llvm -mcpu=haswell", (1, 3, 224, 224), (256, 3, 16, 16), (16, 16), "1x2x7"),
    ("llvm -mcpu=haswell", (1, 256, 16, 16), (256, 256, 3, 3), (1, 1), "1x2x7"),
    ("llvm -mcpu=skylake-avx512", (1, 256, 29, 29), (256, 256, 3, 3), (2, 2), "2x1x7"),
])
def test_strided_layers_on_16_registers_take_tiles_of_two_vectors(target, data, weight,
                                                                   strides, first):
    """On 16 vector registers a 3x3/2 layer's default tile is two vectors of channels by a
    few pixels (``channels.channel_tiles``); a stride-1 layer, a wider window and
    targets of 32 registers keep the longest rows; every tile fits the registers."""
    tiles = strategy.tiles_for(Target(target))
    found = strategy.channel_tiles(tiles, conv_node(data, weight, strides=strides))
    assert found[0] == first
    for tile in found:
        v, r, c = (int(k) for k in tile.split("x"))
        assert v * r * c + v + (r * c if v > 1 else 0) <= tiles.registers - 1, tile


def test_depthwise_convolutions_have_their_own_tiles():
    """A depthwise convolution is never packed: its knobs are one channel's rows and columns."""
    node = conv_node((1, 16, 7, 7), (16, 1, 3, 3), groups=16)
    tiles = strategy.tiles_for(TARGET)
    assert strategy.channel_tiles(tiles, node) == []
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, node, padded=True)
    assert set(space.space_map) == {"tile_y", "tile_x", "pad"}


def test_default_layout_follows_the_reduction():
    """Channels by default for a long reduction (input channels x window), columns for a
    short one, a longer one counting as short on a wide map (among the strategies other than
    a pointwise layer's ``pixels``, which is first where it is the default)."""
    tiles = strategy.tiles_for(Target("llvm -mcpu=znver4"))

    def default(data, weight, **attrs):
        space = autotvm.ConfigSpace()
        strategy.define_conv_knobs(space, tiles, conv_node(data, weight, **attrs), padded=False)
        return next(e.val for e in space.space_map["layout"].entities if e.val != "pixels")
    assert default((1, 512, 7, 7), (512, 512, 1, 1)) == "channels"
    assert default((1, 64, 56, 56), (256, 64, 1, 1)) == "columns"
    assert default((1, 256, 28, 28), (512, 256, 1, 1), strides=(2, 2)) == "channels"
    assert default((1, 64, 56, 56), (128, 64, 3, 3), strides=(2, 2)) == "channels"
    assert default((1, 32, 28, 28), (192, 32, 1, 1)) == "columns"
    assert default((1, 256, 56, 56), (64, 256, 1, 1)) == "channels"
    assert default((1, 3, 229, 229), (64, 3, 7, 7), strides=(2, 2)) == "columns"


@pytest.mark.parametrize("target, data, weight, strides, unrolled", [
    ("llvm -mcpu=skylake-avx512", (1, 64, 56, 56), (128, 64, 3, 3), (2, 2), True),
    ("llvm -mtriple=aarch64-linux-gnu", (1, 64, 56, 56), (128, 64, 3, 3), (2, 2), True),
    ("llvm -mcpu=haswell", (1, 64, 56, 56), (128, 64, 3, 3), (2, 2), False),
    ("llvm -mcpu=skylake-avx512", (1, 512, 7, 7), (512, 512, 3, 3), (1, 1), False),
    ("llvm -mcpu=skylake-avx512", (1, 3, 229, 229), (64, 3, 7, 7), (2, 2), True),
    ("llvm -mcpu=haswell", (1, 3, 229, 229), (64, 3, 7, 7), (2, 2), True),
    ("llvm -mcpu=haswell", (1, 3, 225, 225), (32, 3, 3, 3), (2, 2), False)])
def test_the_kernel_row_is_unrolled_by_default_where_it_gains(target, data, weight, strides,
                                                               unrolled):
    """The ``unroll_kw`` knob's default (``conv2d._unrolls_row``): a strided ``channels``
    layer on a target of 32 vector registers (AVX-512, aarch64; not AVX2's 16), a direct
    layer of a row of 5 or more (the 7x7 stems) on every target; not a stride-1 layer nor a
    3x3 direct one."""
    tiles = strategy.tiles_for(Target(target))
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, conv_node(data, weight, strides=strides),
                               padded=True)
    assert space.space_map["unroll_kw"].entities[0].val is unrolled


@pytest.mark.parametrize("target, pairs", [
    ("llvm -mcpu=haswell", True), ("llvm -mcpu=x86-64", False),
    ("llvm -mcpu=skylake-avx512", False), ("llvm -mtriple=aarch64-linux-gnu", False)])
def test_an_odd_map_takes_rows_in_pairs_on_avx2(target, pairs):
    """ResNet's 512 -> 512 3x3 on 7x7: on AVX2 a tile of 2 rows x 7 columns first (14
    accumulators; the last tile a row short), elsewhere rows that divide the map's."""
    tiles = strategy.tiles_for(Target(target))
    found = strategy.channel_tiles(tiles, conv_node((1, 512, 9, 9), (512, 512, 3, 3)))
    assert (found[0] == "1x2x7") is pairs
    assert any(tile.split("x")[1] == "2" for tile in found) is pairs


@pytest.mark.parametrize("target, data, weight, tile", [
    ("llvm -mcpu=haswell", (1, 3, 224, 224), (64, 3, 3, 3), (8, 8)),
    ("llvm -mcpu=haswell", (1, 3, 226, 226), (64, 3, 3, 3), (6, 16)),
    ("llvm -mcpu=haswell", (1, 3, 224, 224), (96, 3, 3, 3), (12, 8)),
    ("llvm -mcpu=haswell", (1, 3, 224, 224), (70, 3, 3, 3), (10, 8)),
    ("llvm -mcpu=haswell", (1, 3, 224, 224), (67, 3, 3, 3), (6, 8)),
    ("llvm -mcpu=x86-64", (1, 3, 224, 224), (64, 3, 3, 3), (8, 4)),
    ("llvm -mcpu=skylake-avx512", (1, 3, 224, 224), (64, 3, 3, 3), (16, 16))])
def test_a_direct_tile_of_fewer_columns_takes_more_channels(target, data, weight, tile):
    """The direct layout's default tile (``tile_f``, ``tile_x``): where the row leaves fewer
    columns than the target's tile (111 columns: one vector of 8 on AVX2, 111 % 16 = 15 left
    to a tail), up to twice the channels, the most that divide the output channels; the
    target's channels where none does, or where the row takes the whole tile."""
    tiles = strategy.tiles_for(Target(target))
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, conv_node(data, weight, strides=(2, 2)),
                               padded=False)
    assert (space.space_map["tile_f"].entities[0].val,
            space.space_map["tile_x"].entities[0].val) == tile


def conv_task(data, weight, attrs, target):
    """The tuning task of a network's convolution (``attrs`` as the workload lists them)."""
    wkl = ("conv2d_nchw", list(data), list(weight),
           [[k, v] for k, v in sorted(attrs.items())], "float32", str(target))
    return tuning.task_of(wkl, flop=1.0)


def config_of(space, **values):
    """The configuration of ``space`` with ``values`` for those knobs, the first entity of
    every other."""
    names = list(space.space_map)
    indices = [0] * len(names)
    for name, value in values.items():
        indices[names.index(name)] = space.space_map[name].index_of(value)
    return space.get(space.index_of(indices))


def run_task(task, config, inputs, target):
    """The output of ``task``'s kernel in ``config`` on ``inputs``, built for ``target``."""
    s, args = task.instantiate(config)
    lib = kernelrpc.build(s, args, target=target)
    out = nd.empty(task.arg_specs[-1][0], "float32")
    lib[lib.metadata["functions"][0]["name"]](*(nd.array(a) for a in inputs), out)
    return out.numpy()


def test_tuning_task_takes_the_weight_and_its_packed_copy():
    """Where the channels layout is offered, the task's arguments are the OIHW weight and its
    packed copy (made from it on the host): a columns configuration reads the one, a channels
    one the other, and neither packs inside the kernel it is timed by."""
    data, weight = [1, 4, 7, 7], [32, 4, 3, 3]
    attrs = {"dilation": [1, 1], "groups": 1, "padding": [1, 1, 1, 1], "strides": [1, 1]}
    task = conv_task(data, weight, attrs, TARGET)
    lanes = strategy.tiles_for(TARGET).lanes
    assert [spec[0] for spec in task.arg_specs[:3]] == [
        tuple(data), tuple(weight), (32 // lanes, 4, 3, 3, lanes)]
    random_inputs = [RNG.standard_normal(shape).astype(dtype)
                     for shape, dtype in task.arg_specs[:3]]
    inputs = task.prepare_inputs(random_inputs)
    np.testing.assert_array_equal(inputs[2], WeightLayout.packed(lanes).transform(inputs[1]))
    expect = task.reference(*inputs)
    space = task.config_space
    configs = [space.get(0)] + [config_of(space, layout="channels", channel_tile=tile.val)
                                for tile in space.space_map["channel_tile"].entities]
    assert {c["layout"].val for c in configs} == {"columns", "channels"}
    for config in configs:
        s, _ = task.instantiate(config)
        assert not any(getattr(st.op, "tag", "") == "weight_pack" for st in s.stages)
        np.testing.assert_allclose(run_task(task, config, inputs, TARGET), expect, rtol=1e-4,
                                   atol=1e-4, err_msg=str(config))
