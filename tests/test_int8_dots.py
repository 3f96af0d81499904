"""The packed int8 layers' instruction records (relay/strategy/int8_dots.py) on each x86
family this host runs (tests/target_families.py): AVX-512 code without VNNI and AVX2 code take
``vpmaddubsw`` + ``vpmaddwd`` where no pair of the layer's weights can saturate the int16 pair
sum (``reduce_range``'s 7-bit weights), and the weights split in halves (``w = 2h + l``, two
``vpmaddubsw`` that cannot saturate) otherwise; SSE code the plain vectors; this host's own
code ``vpdpbusd`` where it has VNNI.

Every record computes the exact int32 sum: the kernels equal their numpy form (zero points
at both ends of the range, uint8 and int8 inputs, odd shapes, channels past the last quad and
block, weights at the pair bound), and quantized networks are within one quantization step of
onnxruntime's (tests/test_onnx_quant.py's rule). The instruction is the one the hottest inner
loop of the built layer runs (its assembly, kernelrpc.compiler.inner_loop), for aarch64's
``sdot`` and ``smull`` and armv7's ``vmlal`` too (the code runs on the emulated Cortex-A76,
A72 and A7, tests/test_onnx_quant_emulated.py).
"""
import re

import numpy as np
import pytest

pytest.importorskip("onnx")
quantization = pytest.importorskip("onnxruntime.quantization")

from target_families import FAMILIES, runs_here  # noqa: E402
from test_onnx_quant import (CNN_CASES, build_run, cnn_model, integers, make,  # noqa: E402
                             output_steps, quantized, requantized_operands)

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.compiler.inner_loop import inner_loops  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.compiler.vector_isa import int8_dot  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import ir  # noqa: E402
from kernelrpc.relay.op import node_flops, quant  # noqa: E402
from kernelrpc.relay.strategy import strategy_for, tiles_for  # noqa: E402
from kernelrpc.relay.strategy.int8_dots import QUAD_DOTS, pairs_fit  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(34)
SEVEN_BITS, EIGHT_BITS = (-64, 64), (-128, 127)

#: the x86 targets of the tests: each family, and this host's own code where it has VNNI
TARGETS = {"avx512": FAMILIES["avx512"], "avx2": FAMILIES["avx2"], "sse": FAMILIES["sse"],
           "vnni": "llvm"}
#: the record each target's packed layers take, for 7-bit and for full-range weights
RECORD = {"avx512": ("vpmaddubsw", "vpmaddubsw_halves"),
          "avx2": ("vpmaddubsw", "vpmaddubsw_halves"),
          "sse": ("vectors", "vectors"), "vnni": ("vpdpbusd", "vpdpbusd")}
DOTS = ("vpdpbusd", "vpmaddubsw", "sdot")


def runs(name):
    """The mark skipping a test of target ``name`` where this host cannot run its code."""
    target = Target(TARGETS[name])
    reason = f"this host cannot run {name} code ({TARGETS[name]})"
    if name == "vnni":
        able, reason = int8_dot(target) == "avx512_vnni", "this host has no AVX512-VNNI"
    else:
        able = runs_here(target)
    return pytest.mark.skipif(not able, reason=reason)


def on(*names):
    return [pytest.param(name, id=name, marks=runs(name)) for name in names]


def check_record(target, node, lib, record):
    """The layer takes ``record`` (:mod:`kernelrpc.relay.strategy.int8_dots`), and its code
    runs the record's instruction and no other dot product."""
    taken = strategy_for(tiles_for(Target(TARGETS.get(target, target))), node)
    assert taken.name.split("_", 2)[-1] == record, taken.name
    instruction = record.split("_")[0]
    assert dots_in(lib) == ({instruction} if instruction in DOTS else set())


def weights(weight_range, *shape):
    return RNG.integers(weight_range[0], weight_range[1] + 1, shape).astype(np.int8)


def packed_conv_case(data_dtype, x_zero, channels, out_channels, strides, weight_range,
                     pixels=False, size=(7, 10), window=False):
    """A packed convolution node (one input ``x`` of ``size`` pixels, its weight packed as
    the importer packs it), an input and numpy's answer of the unpacked layer; with
    ``pixels`` a pointwise layer of 48 pixels (3 vectors of 16) in the ``pixels`` form, with
    ``window`` the 3x3 layer in the ``pixels`` form over its taps."""
    size, kernel, padding = ((4, 12), 1, (0, 0, 0, 0)) if pixels else (size, 3, (1, 2, 1, 0))
    data = ir.Node("input", (), {}, (1, channels, *size), data_dtype, "x")
    weight = weights(weight_range, out_channels, channels, kernel, kernel)
    bias = RNG.integers(-3000, 3000, out_channels).astype(np.int32)
    lo, hi = quant.qrange("uint8")
    layout = quant.PACKED_PIXELS if pixels else quant.PACKED_WINDOW if window else quant.PACKED
    attrs = dict(strides=strides, dilation=(1, 1), padding=padding, groups=1, out_zero=7,
                 out_min=lo, out_max=hi, out_dtype="uint8", kernel_layout=layout)
    packed = quant.pack_weight(weight)
    if window:
        attrs["window"] = (kernel, kernel)
        packed = quant.pack_weight(quant.window_weight(weight))
    multiplier = np.asarray(RNG.random(out_channels) * 2e-3 + 1e-4, np.float32)
    inputs = [data, ir.const(packed), ir.const(np.asarray(x_zero, np.int32)),
              ir.const(quant.packed_bias(bias, weight, data_dtype, x_zero)),
              ir.const(multiplier)]
    x = integers(data_dtype, 1, channels, *size)
    expected = quant.np_qconv2d([x, weight, np.asarray(x_zero), bias, multiplier],
                                dict(attrs, kernel_layout="OIHW", window=None))
    return make("qnn.conv2d", inputs, **attrs), data, x, expected


def dots_in(lib) -> set:
    asm = lib.get_source("asm")
    return {name for name in DOTS if re.search(rf"\b{name}\b", asm)}


def bits(weight_range) -> str:
    return "7-bit" if weight_range == SEVEN_BITS else "8-bit"


def combinations(cases):
    """Every case on the pairs families with 7-bit weights; the first with full-range weights
    there, on VNNI and on SSE (the plain vectors, as full-range weights have on AVX2)."""
    params = []
    for name, weight_range, chosen in (
            ("avx512", SEVEN_BITS, cases), ("avx2", SEVEN_BITS, cases),
            ("avx512", EIGHT_BITS, cases[:1]), ("avx2", EIGHT_BITS, cases[:1]),
            ("vnni", EIGHT_BITS, cases[:2]), ("sse", SEVEN_BITS, cases[:1])):
        for case in chosen:
            params.append(pytest.param(name, weight_range, *case, marks=runs(name),
                                       id=f"{name}-{bits(weight_range)}-{case[0]}{case[1]}"))
    return params


#: integer depthwise layers: (input size, stride, padding); odd maps whose rows and columns
#: the tiles do not divide
DEPTHWISE_CASES = {"stride 1": ((9, 23), (1, 1), (1, 1, 1, 1)),
                   "stride 2, asymmetric padding": ((15, 58), (2, 2), (0, 0, 1, 1))}


@pytest.mark.parametrize("case", sorted(DEPTHWISE_CASES))
@pytest.mark.parametrize("target", on("avx512", "avx2", "sse"))
def test_every_depthwise_tile_and_pad_place_computes_the_layer(target, case, monkeypatch):
    """Each row and column tile and each place of the padded input (in place, in the
    channel's loop, at the root, by bands of rows, the centered input converted at the root)
    the integer depthwise schedule's space offers equals numpy's answer, the uint8 input's
    zero point near the top of its range."""
    from kernelrpc.autotvm import ConfigSpace
    from kernelrpc.relay.strategy import depthwise, int8

    size, strides, padding = DEPTHWISE_CASES[case]
    data = ir.Node("input", (), {}, (1, 5, *size), "uint8", "x")
    weight = weights(EIGHT_BITS, 5, 1, 3, 3)
    bias = RNG.integers(-3000, 3000, 5).astype(np.int32)
    multiplier = np.asarray(RNG.random(5) * 2e-2 + 1e-3, np.float32)
    attrs = dict(strides=strides, dilation=(1, 1), padding=padding, groups=5, out_zero=3,
                 out_min=0, out_max=255, out_dtype="uint8")
    inputs = [data, ir.const(weight), ir.const(np.asarray(251, np.uint8)), ir.const(bias),
              ir.const(multiplier)]
    node = make("qnn.conv2d", inputs, **attrs)
    x = integers("uint8", 1, 5, *size)
    x[..., ::7] = 0
    expected = quant.np_qconv2d([x, weight, np.asarray(251), bias, multiplier], attrs)
    tiles = tiles_for(Target(TARGETS[target]))

    def space():
        cfg = ConfigSpace()
        strategy_for(tiles, node).define_knobs(cfg, tiles, node, True)
        return {name: [e.val for e in knob.entities] for name, knob in cfg.space_map.items()}
    values = space()
    assert sorted(values["pad"]) == sorted(int8.QPAD_PLACES)
    configs = [(rows, columns, values["pad"][0]) for rows in values["tile_y"]
               for columns in values["tile_x"]]
    configs += [(values["tile_y"][0], values["tile_x"][0], p) for p in values["pad"][1:]]
    for tile_y, tile_x, pad in configs:      # each one the default schedule in turn
        monkeypatch.setattr(depthwise, "depthwise_tile", lambda *_, t=(tile_y, tile_x): t)
        monkeypatch.setattr(int8, "_depthwise_pad", lambda *_, p=pad: p)
        chosen = space()
        assert [chosen[k][0] for k in ("tile_y", "tile_x", "pad")] == [tile_y, tile_x, pad]
        got, _ = build_run(node, [data], {"x": x}, TARGETS[target])
        np.testing.assert_array_equal(got, expected, err_msg=f"{case} {tile_y} {tile_x} {pad}")


def test_integer_depthwise_input_place_follows_the_target():
    """Under 16 lanes every integer depthwise layer converts its channel's plane (a strided
    layer's phases) once in the channel's loop; AVX-512 keeps its in-place and band rules."""
    from kernelrpc.relay.strategy import int8

    def layer(size, stride):
        data = ir.Node("input", (), {}, (1, 8, size, size), "uint8", "x")
        attrs = dict(strides=(stride, stride), dilation=(1, 1), padding=(1, 1, 1, 1),
                     groups=8, out_zero=3, out_min=0, out_max=255, out_dtype="uint8")
        return make("qnn.conv2d", [data, ir.const(weights(EIGHT_BITS, 8, 1, 3, 3)),
                                   ir.const(np.asarray(128, np.uint8)),
                                   ir.const(np.zeros(8, np.int32)),
                                   ir.const(np.full(8, 1e-2, np.float32))], **attrs)
    shapes = [(112, 1), (56, 1), (28, 1), (7, 1), (112, 2), (56, 2), (28, 2), (14, 2)]
    for name in ("avx2", "sse"):
        tiles = tiles_for(Target(TARGETS[name]))
        assert {int8._depthwise_pad(tiles, layer(*shape)) for shape in shapes} == {"channel"}
    avx512 = tiles_for(Target(TARGETS["avx512"]))
    assert [int8._depthwise_pad(avx512, layer(*shape)) for shape in shapes] == \
        ["channel", "channel", "channel", "inline", "band", "band", "inline", "inline"]


@pytest.mark.parametrize("target,weight_range,data_dtype,x_zero,channels,out_channels,strides",
                         combinations([
                             ("uint8", 255, 6, 21, (1, 1)),  # channels past a quad and a block
                             ("int8", -128, 8, 32, (2, 1)),  # int8 data shifted by 128
                             ("int8", 127, 5, 16, (1, 2)),
                             ("uint8", 0, 3, 16, (1, 1))]))
def test_packed_qconv2d_against_numpy(target, weight_range, data_dtype, x_zero, channels,
                                      out_channels, strides):
    node, data, x, expected = packed_conv_case(data_dtype, x_zero, channels, out_channels,
                                               strides, weight_range)
    got, lib = build_run(node, [data], {"x": x}, TARGETS[target])
    np.testing.assert_array_equal(got, expected)
    # the packed node's numpy form (the tuner's reference): int8 data pads with its shifted zero
    inputs = [x, *(i.value for i in node.inputs[1:])]
    np.testing.assert_array_equal(quant.np_qconv2d(inputs, node.attrs), expected)
    check_record(target, node, lib, RECORD[target][weight_range == EIGHT_BITS])
    assert node_flops(node) == 2 * expected.size * channels * 3 * 3


@pytest.mark.parametrize("target,weight_range,data_dtype,x_zero,channels,out_channels,strides",
                         combinations([
                             ("uint8", 255, 3, 21, (2, 2)),  # a first layer: 27 taps, 7 quads
                             ("int8", -128, 2, 32, (1, 1)),
                             ("uint8", 0, 4, 16, (2, 2))]))
def test_window_qconv2d_against_numpy(target, weight_range, data_dtype, x_zero, channels,
                                      out_channels, strides):
    """A 3x3 layer of few input channels in the ``pixels`` form over its taps (the quads run
    over (channel, row, column), the zero point outside the map and past the last tap)
    equals numpy's, with the record of its target; so does the numpy form of the packed
    weight, and the flops count the window."""
    node, data, x, expected = packed_conv_case(data_dtype, x_zero, channels, out_channels,
                                               strides, weight_range, size=(8, 16), window=True)
    got, lib = build_run(node, [data], {"x": x}, TARGETS[target])
    np.testing.assert_array_equal(got, expected)
    inputs = [x, *(i.value for i in node.inputs[1:])]
    np.testing.assert_array_equal(quant.np_qconv2d(inputs, node.attrs), expected)
    taken = strategy_for(tiles_for(Target(TARGETS[target])), node)
    assert taken.name.startswith("int8_pixels_"), taken.name
    check_record(target, node, lib, RECORD[target][weight_range == EIGHT_BITS])
    assert node_flops(node) == 2 * expected.size * channels * 3 * 3


def _stem(kernel: int, stride: int = 2):
    """A network's first layer as the importer packs it: 3 uint8 channels -> 16, a ``kernel``
    window, 16 x 16 input, its output pixels whole vectors of 16; the node, its input, an
    input and numpy's answer."""
    data = ir.Node("input", (), {}, (1, 3, 16, 16), "uint8", "x")
    weight = weights(SEVEN_BITS, 16, 3, kernel, kernel)
    bias = RNG.integers(-3000, 3000, 16).astype(np.int32)
    pad = kernel // 2
    attrs = dict(strides=(stride, stride), dilation=(1, 1), padding=(pad,) * 4, groups=1,
                 out_zero=7, out_min=0, out_max=255, out_dtype="uint8",
                 kernel_layout=quant.PACKED)
    multiplier = np.asarray(RNG.random(16) * 2e-3 + 1e-4, np.float32)
    inputs = [data, ir.const(quant.pack_weight(weight)), ir.const(np.asarray(9, np.int32)),
              ir.const(quant.packed_bias(bias, weight, "uint8", 9)), ir.const(multiplier)]
    x = integers("uint8", 1, 3, 16, 16)
    expected = quant.np_qconv2d([x, weight, np.asarray(9), bias, multiplier],
                                dict(attrs, kernel_layout="OIHW", window=None))
    return make("qnn.conv2d", inputs, **attrs), data, x, expected


def test_window_form_is_the_targets_for_few_channels_and_a_small_window():
    """The build, not the importer, chooses the form, for its target: 3 input channels and a
    3x3 window (27 taps) take the window form everywhere, a 7x7 one (147) where a quad step is
    a ``vpmaddubsw`` pair (AVX2, AVX512BW) and not with ``vpdpbusd`` or plain vectors; 5
    channels, or output pixels short of whole vectors, keep the packed form; the repacked
    layer computes what the packed one does; a window form whose window or weight disagree
    is refused by name."""
    from kernelrpc.relay.strategy import int8
    from kernelrpc.relay.tuning import int8_forms

    attrs = {"groups": 1}
    assert quant.is_window_layer(attrs, (3, 3), 3, 112 * 112)
    assert not quant.is_window_layer(attrs, (7, 7), 3, 112 * 112)
    assert quant.is_window_layer(attrs, (7, 7), 3, 112 * 112, int8.WINDOW_TRIPLES_PAIRS)
    assert not quant.is_window_layer(attrs, (3, 3), 5, 112 * 112)
    assert not quant.is_window_layer(attrs, (3, 3), 3, 7 * 7)
    assert not quant.is_window_layer(attrs, (1, 1), 3, 112 * 112)
    pairs = {"avx2": True, "avx512": True, "sse": False, "vnni": False}
    for name, target in (("avx2", TARGETS["avx2"]), ("avx512", TARGETS["avx512"]),
                         ("sse", TARGETS["sse"]), ("vnni", "llvm -mcpu=icelake-server")):
        tiles = tiles_for(Target(target))
        for kernel, window in ((3, True), (7, pairs[name])):
            node, data, x, expected = _stem(kernel)
            (built,) = int8_forms(ir.Function([data], [node]), tiles).outputs
            form = quant.PACKED_WINDOW if window else quant.PACKED
            assert built.attrs["kernel_layout"] == form, (name, kernel)
            if window:
                assert built.attrs["window"] == (kernel, kernel)
                inputs = [x, *(i.value for i in built.inputs[1:])]
                np.testing.assert_array_equal(quant.np_qconv2d(inputs, built.attrs), expected)
    for name in ("avx2", "sse"):                 # the build repacks and runs it
        if runs_here(Target(TARGETS[name])):
            node, data, x, expected = _stem(7)
            got, lib = build_run(node, [data], {"x": x}, TARGETS[name])
            np.testing.assert_array_equal(got, expected)
            weight_shape = lib.executor["kernels"][0]["workload"][2]
            assert (weight_shape[2:4] == [1, 1]) == pairs[name], weight_shape
    node = packed_conv_case("uint8", 3, 3, 16, (1, 1), SEVEN_BITS, size=(8, 16), window=True)[0]
    for window in (None, (3,), (3, 0), (5, 5), ("3", 3)):
        with pytest.raises(quant.ModelError, match="window"):
            make("qnn.conv2d", list(node.inputs), **dict(node.attrs, window=window))


@pytest.mark.parametrize("target", on("vnni", "avx512", "avx2"))
def test_every_packed_tile_of_the_space_computes_the_layer(target, monkeypatch):
    """Each register tile the packed convolution's space offers (rows x columns x blocks of
    16 channels, :func:`~kernelrpc.relay.strategy.int8.int8_tiles`) on a 7 x 7 map of 64
    channels (four blocks: tiles of one, two and four) equals numpy's answer."""
    from kernelrpc.relay.strategy import int8

    node, data, x, expected = packed_conv_case("uint8", 3, 12, 64, (1, 1), SEVEN_BITS,
                                               size=(7, 7))
    tiles = tiles_for(Target(TARGETS[target]))
    space = int8.int8_tiles(tiles, node, next(d for d in QUAD_DOTS if d.applies(tiles, node)))
    assert any(t.count("x") == 2 for t in space), space
    for tile in space:
        monkeypatch.setattr(int8, "int8_tiles", lambda *args, tile=tile: [tile])
        got, _ = build_run(node, [data], {"x": x}, TARGETS[target])
        np.testing.assert_array_equal(got, expected, err_msg=tile)


@pytest.mark.parametrize("target,weight_range,data_dtype,x_zero,channels,out_channels,strides",
                         combinations([
                             ("uint8", 255, 6, 21, (1, 1)),  # channels past a quad and a block
                             ("int8", -128, 8, 24, (1, 1))]))
def test_pixels_qconv2d_against_numpy(target, weight_range, data_dtype, x_zero, channels,
                                      out_channels, strides):
    """A pointwise layer in the ``pixels`` form (16 pixels of a channel a vector, the
    weight's quad broadcast) equals numpy's, with the record of its target."""
    node, data, x, expected = packed_conv_case(data_dtype, x_zero, channels, out_channels,
                                               strides, weight_range, pixels=True)
    got, lib = build_run(node, [data], {"x": x}, TARGETS[target])
    np.testing.assert_array_equal(got, expected)
    taken = strategy_for(tiles_for(Target(TARGETS[target])), node)
    assert taken.name.startswith("int8_pixels_"), taken.name
    check_record(target, node, lib, RECORD[target][weight_range == EIGHT_BITS])


@pytest.mark.parametrize("target,weight_range,data_dtype,x_zero,out_dtype,shape", combinations([
    ("uint8", 255, "int8", (5, 37, 19)),       # a reduction past the last quad
    ("int8", -128, "int32", (9, 64, 48)),      # MatMulInteger's int32, int8 data shifted
    ("int8", 127, "uint8", (1, 16, 16))]))
def test_packed_qdense_against_numpy(target, weight_range, data_dtype, x_zero, out_dtype, shape):
    rows, depth, columns = shape
    data = ir.Node("input", (), {}, (rows, depth), data_dtype, "x")
    weight = weights(weight_range, depth, columns)
    extra, attrs = requantized_operands(columns, out_dtype)
    inputs = [data, ir.const(quant.pack_dense_weight(weight)),
              ir.const(np.asarray(x_zero, np.int32)),
              ir.const(weight.astype(np.int32).sum(axis=0, dtype=np.int32)), *extra]
    x = integers(data_dtype, rows, depth)
    node = make("qnn.dense", inputs, kernel_layout=quant.PACKED_DENSE, **attrs)
    got, lib = build_run(node, [data], {"x": x}, TARGETS[target])
    expected = quant.np_qdense([x, weight, inputs[2].value] + [i.value for i in inputs[4:]],
                               attrs)
    np.testing.assert_array_equal(got, expected)
    check_record(target, node, lib, RECORD[target][weight_range == EIGHT_BITS])


@pytest.mark.parametrize("target", on("avx2", "avx512"))
def test_vpmaddubsw_at_the_pair_bound(target):
    """Pairs of weights whose positive (negative) parts sum to 128 (-128) times inputs of 255
    reach 32640 (-32640), within int16: the pairs record takes the layer and each output
    (its bias 100 less the sum, its multiplier 1) is exactly numpy's. One more on a weight
    could pass 32767: the layer takes the weights in halves, exact too."""
    weight = np.zeros((16, 2, 1, 1), np.int8)
    weight[0::2] = np.array([127, 1]).reshape(2, 1, 1)
    weight[1::2] = np.array([-64, -64]).reshape(2, 1, 1)
    data = ir.Node("input", (), {}, (1, 2, 3, 5), "uint8", "x")
    x = np.full((1, 2, 3, 5), 255, np.uint8)
    x[..., 0] = RNG.integers(0, 256, (2, 3))
    attrs = dict(strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), groups=1, out_zero=0,
                 out_min=0, out_max=255, out_dtype="uint8", kernel_layout=quant.PACKED)
    ones = np.ones(16, np.float32)
    for extra, record in ((0, "vpmaddubsw"), (1, "vpmaddubsw_halves")):
        w = weight.copy()
        w[0, 1] += extra
        assert pairs_fit(quant.pack_weight(w)) == (extra == 0)
        bias = (100 - 255 * w.astype(np.int32).sum(axis=(1, 2, 3))).astype(np.int32)
        inputs = [data, ir.const(quant.pack_weight(w)), ir.const(np.asarray(0, np.int32)),
                  ir.const(quant.packed_bias(bias, w, "uint8", 0)), ir.const(ones)]
        node = make("qnn.conv2d", inputs, **attrs)
        got, lib = build_run(node, [data], {"x": x}, TARGETS[target])
        expected = quant.np_qconv2d([x, w, np.asarray(0), bias, ones],
                                    dict(attrs, kernel_layout="OIHW"))
        assert (expected[..., 1:] == 100).all()
        np.testing.assert_array_equal(got, expected)
        check_record(target, node, lib, record)


# ------------------------------------------------------------------ networks against onnxruntime


NETWORK_CASES = {
    "u8-per-channel-7-bit": dict(CNN_CASES["qdq-u8s8-per-channel"], reduce_range=True),
    "s8-symmetric-7-bit": dict(CNN_CASES["qdq-s8s8-symmetric"], reduce_range=True),
    "u8-per-channel-8-bit": CNN_CASES["qdq-u8s8-per-channel"],
}


def run_for(model, feeds, target):
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=target, params=params)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**feeds)
    m.run()
    return lib, m.get_output(0).numpy()


@pytest.mark.parametrize("target,case", [
    *[pytest.param("avx2", case, id=f"avx2-{case}", marks=runs("avx2"))
      for case in sorted(NETWORK_CASES)],
    pytest.param("avx512", "u8-per-channel-7-bit", id="avx512-u8-per-channel-7-bit",
                 marks=runs("avx512"))])
def test_quantized_cnn_against_onnxruntime(tmp_path, target, case):
    """The CNN of tests/test_onnx_quant.py (odd 11x13 map, 3 input channels, a depthwise, a 1x1
    convolution and a Gemm) quantized by onnxruntime, built for the family, within one
    quantization step of onnxruntime's int8 run on this host, the same top-1 class."""
    model = quantized(tmp_path, cnn_model(), (1, 3, 11, 13), **NETWORK_CASES[case])
    feeds = {"x": np.asarray(RNG.standard_normal((1, 3, 11, 13)), np.float32)}
    lib, got = run_for(model, feeds, TARGETS[target])
    expected = onnxruntime_outputs(model, feeds)[0]
    step = output_steps(model)[0]
    assert np.abs(got - expected).max() <= step * (1 + 1e-5)
    assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()
    assert dots_in(lib) == {"vpmaddubsw"}


# ------------------------------------------------------------------ the instruction in the hot loop


#: the integer multiplies of each architecture's inner loops
MULTIPLIES = {"x86_64": re.compile(r"^(vpdpbusd|vpmaddubsw|vpmaddwd|vpmulld)\b"),
              "aarch64": re.compile(r"^(sdot|sadalp|smlal2?|smull2?|mla|mul)\b"),
              "arm": re.compile(r"^(vmull|vmlal|vpadal|vmla|vmul)\.[sui]\d+$")}


def family(arch: str) -> str:
    return "arm" if arch.startswith(("arm", "thumb")) else arch


def loop_bodies(asm: str, arch: str) -> dict:
    """Each inner loop's instructions (kernelrpc.compiler.inner_loop's loops), by label."""
    comment = {"aarch64": "//", "arm": "@"}.get(family(arch), "#")
    lines = [line.split(comment)[0].strip() for line in asm.splitlines()]
    bodies = {}
    for loop in inner_loops(asm, arch):
        start = lines.index(f"{loop.label}:")
        body = [line for line in lines[start + 1:] if line and not line.startswith(".") and
                not line.endswith(":")]
        bodies[loop.label] = [line.split()[0] for line in body[:loop.instructions]]
    return bodies


def hottest_int8_loop(asm: str, arch: str) -> list:
    """The inner loop with the most integer multiplies."""
    return max(loop_bodies(asm, arch).values(),
               key=lambda body: sum(1 for op in body if MULTIPLIES[family(arch)].match(op)))


@pytest.mark.parametrize("spec,instruction,others", [
    ("llvm -mcpu=haswell", "vpmaddubsw", {"vpmaddwd"}),
    ("llvm -mcpu=skylake-avx512", "vpmaddubsw", {"vpmaddwd"}),
    ("llvm -mcpu=cascadelake", "vpdpbusd", set()),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", "sdot", set()),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "sadalp", {"smull", "smull2", "mul"}),
    ("llvm -mtriple=armv7-linux-gnueabihf -mcpu=cortex-a7 -mattr=+neon,+vfp4", "vmlal.s8",
     {"vmull.s8", "vpadal.s16"}),
])
def test_the_hottest_loop_of_an_int8_conv_runs_the_instruction(spec, instruction, others):
    """ResNet-18's 3x3 layer of 64 channels on 14x14 (7-bit weights), compiled here: its
    hottest loop is a loop of the instruction, one a block of 16 outputs per column (two on
    AVX2's ymm, four on aarch64 and armv7), with no multiply but its own (aarch64 without the
    dot product: its int8 products, ``smull`` or ``mul`` on widened weights, summed by
    ``addp`` and ``sadalp``; armv7: ``vmull.s8`` and ``vmlal.s8`` summed by ``vpadal.s16``)."""
    target = Target(spec)
    body = hottest_int8_loop(_resnet_layer_asm(target), target.arch)
    multiplies = {op for op in body if MULTIPLIES[family(target.arch)].match(op)}
    assert instruction in multiplies and multiplies <= {instruction, *others}, body
    assert body.count(instruction) >= 8


def _resnet_layer_asm(target) -> str:
    """The assembly of ResNet-18's 3x3 layer of 64 channels on 14x14 (7-bit weights)."""
    node = packed_conv_case("uint8", 0, 64, 64, (1, 1), SEVEN_BITS)[0]
    node = make("qnn.conv2d", [ir.Node("input", (), {}, (1, 64, 14, 14), "uint8", "x"),
                               *node.inputs[1:]], **dict(node.attrs, padding=(1, 1, 1, 1)))
    return relay.build(ir.IRModule(ir.Function([node.inputs[0]], [node])),
                       target=target).get_source("asm")


@pytest.mark.parametrize("spec", ["llvm -mcpu=cascadelake", "llvm -mcpu=skylake-avx512",
                                  "llvm -mcpu=haswell",
                                  "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76"])
def test_the_accumulators_stay_in_registers_across_the_reduction(spec):
    """The intrinsic's accumulators start before the reduction's loops, so its hottest loop
    (the input's quads, one block step per column) stores nothing: it kept a vpdpbusd
    tile's 28 accumulators in zmm registers but stored them at every step (26 stores in a
    loop of 97 instructions)."""
    target = Target(spec)
    asm = _resnet_layer_asm(target)
    bodies = loop_bodies(asm, target.arch)
    multiplies = MULTIPLIES[family(target.arch)]
    label = max(bodies, key=lambda label: sum(1 for op in bodies[label] if multiplies.match(op)))
    mix = next(loop for loop in inner_loops(asm, target.arch) if loop.label == label)
    assert mix.stores == 0, bodies[label]
