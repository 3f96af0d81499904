"""The ``pixels`` strategy of pointwise convolutions (a matrix product over the flattened
pixels): where it is offered and the default, every tile and order its knobs offer computing
the convolution with the group's tail (bias, relu, a residual input) on every vector width,
on shapes whose pixels and channels the tiles do not divide, and its tuning task."""
import numpy as np
import pytest

pytest.importorskip("onnx")

from kernelrpc import autotvm, relay, te  # noqa: E402
from kernelrpc.compiler import expr as E  # noqa: E402
from kernelrpc.compiler.lower import arith  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.relay import ir, strategy  # noqa: E402
from kernelrpc.relay.strategy import pointwise  # noqa: E402

from target_families import FAMILIES, family_params, runs_here  # noqa: E402
from test_relay_conv_channels import RNG, Knobs, config_of, conv_layer, conv_model, conv_node, \
    conv_task, run, run_task  # noqa: E402

CASES = {
    "13x13, a tail of pixels and of channels": dict(x=(1, 24, 13, 13), w=(20, 24, 1, 1)),
    "batch 2, residual": dict(x=(2, 16, 7, 9), w=(40, 16, 1, 1), residual=True),
    "narrowing, one row": dict(x=(1, 72, 1, 37), w=(8, 72, 1, 1)),
    "stride 2, odd sizes": dict(x=(1, 16, 27, 31), w=(24, 16, 1, 1), strides=(2, 2)),
    "stride (2, 1)": dict(x=(2, 8, 14, 11), w=(16, 8, 1, 1), strides=(2, 1), residual=True),
    "panels, tails of pixels and of channels": dict(x=(1, 128, 13, 13), w=(136, 128, 1, 1)),
    "panels, stride 2, batch 2": dict(x=(2, 128, 13, 15), w=(128, 128, 1, 1), strides=(2, 2),
                                      residual=True),
    "panels, strided rows across a panel": dict(x=(1, 128, 25, 23), w=(128, 128, 1, 1),
                                                strides=(2, 2)),
}


def _space(target, conv):
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, strategy.tiles_for(target), conv, padded=False)
    return {name: [e.val for e in knob.entities] for name, knob in space.space_map.items()}


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pixels_tile_computes_the_convolution(case, target):
    mod, params, feeds, expect, conv = conv_layer(**CASES[case])
    values = _space(target, conv)
    assert "pixels" in values["layout"]
    panels = pointwise.reads_panels(strategy.tiles_for(target), conv)
    configs = [dict(tile_m=m, tile_n=n) for m in values["tile_m"] for n in values["tile_n"]]
    configs += [dict(pixel_order=order) for order in values["pixel_order"]]
    for knobs in configs:
        with Knobs(layout="pixels", **knobs):
            lib = relay.build(mod, target=target, params=params)
        (record,) = lib.executor["kernels"]
        assert {k: record["config"][k] for k in knobs} == knobs
        assert ("pixel_panels" in lib.lib.get_source("lowered")) == panels
        np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                                   atol=1e-4 * np.abs(expect).max(),
                                   err_msg=f"{case} {knobs} {target}")


def test_the_panel_cases_read_panels_on_8_lanes():
    """The cases named for panels exercise them on AVX2 code, which runs on any CI host."""
    tiles = strategy.tiles_for(Target("llvm -mcpu=haswell"))
    for case in (c for c in CASES if c.startswith("panels")):
        *_, conv = conv_layer(**CASES[case])
        assert pointwise.reads_panels(tiles, conv), case


def test_panels_where_many_channels_share_each_one():
    """AVX2 code: ResNet-50's wide layers read panels (7x7, 14x14, the strided shortcuts);
    a layer of few channels reads its input in place, as does MobileNet-v2's 960 -> 160 on
    7x7, whose threads share out each tile of pixels' channel tiles; SSE and scalar code
    never."""
    avx2, sse, scalar = (strategy.tiles_for(Target(t)) for t in (
        "llvm -mcpu=haswell", "llvm -mcpu=x86-64", "llvm -mtriple=riscv64-linux-gnu"))

    def panels(tiles, data, weight, **attrs):
        return pointwise.reads_panels(tiles, conv_node(data, weight, **attrs))
    assert panels(avx2, (1, 2048, 7, 7), (512, 2048, 1, 1))
    assert panels(avx2, (1, 1024, 14, 14), (512, 1024, 1, 1))
    assert panels(avx2, (1, 256, 56, 56), (512, 256, 1, 1), strides=(2, 2))
    assert not panels(avx2, (1, 16, 112, 112), (96, 16, 1, 1))
    assert not panels(avx2, (1, 256, 56, 56), (64, 256, 1, 1))
    assert not panels(avx2, (1, 960, 7, 7), (160, 960, 1, 1))
    assert not panels(sse, (1, 2048, 7, 7), (512, 2048, 1, 1))
    assert not panels(scalar, (1, 2048, 7, 7), (512, 2048, 1, 1))


def test_pixels_is_the_default_from_13x13_and_on_7x7_with_16_registers():
    avx512, avx2 = (strategy.tiles_for(Target(t)) for t in ("llvm -mcpu=skylake-avx512",
                                                             "llvm -mcpu=haswell"))

    def first(tiles, data, weight, **attrs):
        return strategy.candidates(tiles, conv_node(data, weight, **attrs))[0].name
    assert first(avx512, (1, 64, 56, 56), (256, 64, 1, 1)) == "pixels"
    assert first(avx512, (1, 512, 13, 13), (1000, 512, 1, 1)) == "pixels"
    assert first(avx512, (1, 512, 7, 7), (2048, 512, 1, 1)) == "channels"
    assert first(avx2, (1, 512, 7, 7), (2048, 512, 1, 1)) == "pixels"
    assert first(avx512, (1, 256, 56, 56), (512, 256, 1, 1), strides=(2, 2)) == "pixels"


@pytest.mark.parametrize("weight, attrs", [
    ((32, 16, 3, 3), {}),
    ((32, 8, 1, 1), {"groups": 2}),
    ((32, 16, 1, 1), {"padding": (1, 1, 1, 1)}),
])
def test_pixels_only_for_pointwise_convolutions(weight, attrs):
    tiles = strategy.tiles_for(Target("llvm -mcpu=haswell"))
    node = conv_node((1, 16, 14, 14), weight, groups=attrs.get("groups", 1))
    node = ir.Node(node.op, node.inputs, {**node.attrs, **attrs}, node.shape, node.dtype,
                   node.name)
    assert "pixels" not in [s.name for s in strategy.candidates(tiles, node)]


def test_the_order_by_default():
    """The channel tiles outside for a layer widening its channels on a large map and for a
    large weight, the pixel tiles outside otherwise."""
    target = Target("llvm -mcpu=skylake-avx512")

    def order(data, weight):
        return _space(target, conv_node(data, weight))["pixel_order"][0]
    assert order((1, 64, 56, 56), (256, 64, 1, 1)) == "channels_outer"
    assert order((1, 256, 56, 56), (64, 256, 1, 1)) == "pixels_outer"
    assert order((1, 64, 14, 14), (384, 64, 1, 1)) == "pixels_outer"
    assert order((1, 512, 13, 13), (1000, 512, 1, 1)) == "channels_outer"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_build_lays_the_weight_out_by_blocks_of_the_tiles_rows(family):
    """The weight the build keeps is ``[O/m][I][m]``, ``m`` the default tile's rows, the
    last block padded with zero rows (32 channels by 6 on AVX2 code: 6 blocks)."""
    target = Target(FAMILIES[family])
    tiles = strategy.tiles_for(target)
    model, feeds, expect = conv_model(x=(1, 24, 13, 13), w=(32, 24, 1, 1))
    mod, params = relay.frontend.from_onnx(model)
    with Knobs():                         # the default configuration, recorded
        lib = relay.build(mod, target=target, params=params)
    (record,) = lib.executor["kernels"]
    assert record["config"]["layout"] == "pixels"
    rows = min(pointwise.pixel_tile(tiles)[0], 32)
    (weight,) = [p for p in lib.get_params().values() if p.shape[1:] == (24, rows)]
    assert weight.shape == (-(-32 // rows), 24, rows)
    assert not weight.transpose(0, 2, 1).reshape(-1, 24)[32:].any()
    if runs_here(target):
        np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                                   atol=1e-4 * np.abs(expect).max())


def test_the_layers_count_is_the_direct_convolutions_whatever_the_weights_layout():
    """The operations a profile divides by: the convolution's, its bias and relu besides."""
    model, _, _ = conv_model(x=(1, 24, 13, 13), w=(32, 24, 1, 1))
    mod, params = relay.frontend.from_onnx(model)
    for layout in ("pixels", "channels", "columns"):
        with Knobs(layout=layout):
            lib = relay.build(mod, target=Target("llvm -mcpu=haswell"), params=params)
        (record,) = lib.executor["kernels"]
        assert record["config"]["layout"] == layout
        assert record["flops"] == (2 * 24 + 2) * 32 * 13 * 13, layout


def test_fused_row_and_column_fold_back_into_one_index():
    p = E.Var("p", "int32")
    q = E.Var("q", "int32")
    ranges = {p: (0, 168), q: (0, 7)}
    flat = arith.simplify(E.floordiv(p, 13) * 13 + E.floormod(p, 13) + q * 169, ranges)
    assert "floordiv" not in str(flat) and "floormod" not in str(flat)
    assert arith.simplify(flat - p - q * 169, ranges).value == 0
    twice = arith.simplify(E.floordiv(p, 13) * 26 + E.floormod(p, 13) * 2, ranges)
    assert "floordiv" not in str(twice) and arith.simplify(twice - p * 2, ranges).value == 0
    kept = arith.simplify(E.floordiv(p, 13) * 12 + E.floormod(p, 13), ranges)
    assert "floordiv" in str(kept)


def test_tuning_task_of_a_pointwise_layer_runs_each_strategy():
    """A pointwise layer's task: its arguments the OIHW weight (which the direct strategy
    reads) and its two copies, made from it, by blocks of 6 rows (``pixels``) and packed
    (``channels``); each configuration reads its own, every ``tile_m`` the blocks of 6; the
    ``pixels`` kernel indexes the input by flattened pixel (a vector runs across a row's
    end: 14 columns are not a vector's width), no division left."""
    from kernelrpc.relay.op.weight_layout import WeightLayout

    target = Target("llvm -mcpu=haswell")
    data, weight = [1, 16, 14, 14], [32, 16, 1, 1]
    attrs = {"dilation": [1, 1], "groups": 1, "padding": [0, 0, 0, 0], "strides": [1, 1]}
    task = conv_task(data, weight, attrs, target)
    assert [spec[0] for spec in task.arg_specs[:-1]] == [
        tuple(data), tuple(weight), (6, 16, 6), (4, 16, 1, 1, 8)]
    inputs = task.prepare_inputs([RNG.standard_normal(shape).astype(dtype)
                                  for shape, dtype in task.arg_specs[:-1]])
    np.testing.assert_array_equal(
        inputs[2], WeightLayout.pointwise(rows=6, out_channels=32).transform(inputs[1]))
    expect = task.reference(*inputs)
    space = task.config_space
    layouts = [e.val for e in space.space_map["layout"].entities]
    assert layouts[0] == "pixels" and "channels" in layouts
    for layout in layouts:
        configs = [config_of(space, layout=layout)]
        if layout == "pixels":
            lowered = str(te.lower(*task.instantiate(configs[0])))
            assert "floordiv" not in lowered and "floormod" not in lowered
            configs += [config_of(space, layout=layout, tile_m=e.val)
                        for e in space.space_map["tile_m"].entities[1:]]
        for config in configs:
            np.testing.assert_allclose(run_task(task, config, inputs, target), expect,
                                       rtol=1e-4, atol=1e-4, err_msg=str(config))


@pytest.mark.parametrize("target, side, row", [
    ("llvm -mcpu=skylake-avx512", 13, 176), ("llvm -mcpu=skylake-avx512", 15, 240),
    ("llvm -mcpu=skylake-avx512", 14, 0), ("llvm -mcpu=skylake-avx512", 16, 0),
    ("llvm -mcpu=skylake-avx512", 27, 0), ("llvm -mcpu=skylake-avx512", 7, 0),
    ("llvm -mcpu=haswell", 13, 0)])
def test_small_maps_run_over_whole_panels(target, side, row):
    """On 16-lane code a 13x13 or 15x15 layer's product runs over its input's panels padded
    with zeros to whole vectors (its last tile whole vectors), which its layout records; a
    16x16 map's pixels are whole vectors already, a 14x14 map's last vector is 4 pixels (a
    short vector), 27x27 and 7x7 maps and 8-lane code keep the map's pixel count (and with
    24 input channels no panels). The answer is the convolution's either way."""
    model, feeds, expect = conv_model(x=(1, 24, side, side), w=(32, 24, 1, 1))
    mod, params = relay.frontend.from_onnx(model)
    with Knobs(layout="pixels"):
        lib = relay.build(mod, target=Target(target), params=params)
    lowered = lib.lib.get_source("lowered")
    assert ("pixel_panels" in lowered) == bool(row)
    layout = next(n.attrs["kernel_layout"] for n in lib.ir_mod["main"].topo()
                  if n.op == "nn.conv2d")
    rows = f"_r{pointwise.pixel_tile(strategy.tiles_for(Target(target)))[0]}_32o"
    if row:
        assert f"[1, {row // 16}, 24, 16]" in lowered      # the panels
        assert layout == "OIHW_pixels16_padded" + rows
    else:
        assert layout == "OIHW_pixels" + rows
    if runs_here(Target(target)):          # the lowering above holds on any host
        np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                                   atol=1e-4 * np.abs(expect).max())


def test_the_panels_and_the_blocks_are_part_of_the_layout_value():
    from kernelrpc.relay.errors import ModelError
    from kernelrpc.relay.op.weight_layout import WeightLayout

    layouts = (WeightLayout.pointwise(), WeightLayout.pointwise(8),
               WeightLayout.pointwise(16, padded=True))
    for layout in layouts:
        assert WeightLayout.parse(layout.attr) == layout and layout.is_model_array
    assert [layout.attr for layout in layouts] == \
        ["OIHW_pixels", "OIHW_pixels8", "OIHW_pixels16_padded"]
    assert WeightLayout.pointwise(0, padded=True) == WeightLayout.pointwise()
    blocked = (WeightLayout.pointwise(rows=6, out_channels=20),
               WeightLayout.pointwise(8, True, rows=4, out_channels=1000))
    for layout in blocked:
        assert WeightLayout.parse(layout.attr) == layout and not layout.is_model_array
    assert [layout.attr for layout in blocked] == \
        ["OIHW_pixels_r6_20o", "OIHW_pixels8_padded_r4_1000o"]
    weight = RNG.standard_normal((20, 3, 1, 1)).astype("float32")
    packed = blocked[0].transform(weight)
    assert packed.shape == blocked[0].shape(weight.shape) == (4, 3, 6)
    np.testing.assert_array_equal(packed.transpose(0, 2, 1).reshape(24, 3)[:20], weight[:, :, 0, 0])
    assert blocked[0].model_shape(packed.shape) == [20, 3, 1, 1]
    assert WeightLayout.pointwise(rows=1, out_channels=20) == WeightLayout.pointwise()
    for bad in ("OIHW_pixels0", "OIHW_pixels1", "OIHW_pixels4096", "OIHW_pixels_rows16",
                "OIHW_pixels8_rows", "OIHW_pixels_padded", "OIHW_pixels_r1_20o",
                "OIHW_pixels8_r65_20o", "OIHW_pixels_r6_0o", "OIHW_pixels_r6o"):
        with pytest.raises(ModelError, match="unknown kernel_layout"):
            WeightLayout.parse(bad)
