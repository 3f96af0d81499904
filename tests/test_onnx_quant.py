"""Quantized networks as ``onnxruntime.quantization`` writes them (QDQ and QOperator from
``quantize_static``, ``quantize_dynamic``), imported as integer operators, built for the host
and checked against onnxruntime; and the integer kernels against their numpy forms.

The agreement rule: a quantized output (one a DequantizeLinear reads) is within one
quantization step of onnxruntime's in every element, ``|got - expected| <= scale``: both
accumulate exactly in int32 and requantize in float32 with round half to even, so they
differ only where float operators between the quantized layers round differently (onnxruntime
runs some in fused kernels) and a value lands on the other side of a rounding boundary. A
float output of a dynamically quantized network is within 1e-4 of its largest magnitude (its
int32 accumulations are exact; only the float32 scaling after them rounds). The top-1 class
is onnxruntime's.
"""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
quantization = pytest.importorskip("onnxruntime.quantization")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import ir  # noqa: E402
from kernelrpc.relay.fuse import partition  # noqa: E402
from kernelrpc.relay.op import get, quant  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from kernelrpc.relay.transform import optimize  # noqa: E402

QuantFormat, QuantType = quantization.QuantFormat, quantization.QuantType


def _init(rng, name, *shape, scale=0.3):
    return numpy_helper.from_array(np.asarray(rng.standard_normal(shape) * scale, np.float32),
                                   name)


def cnn_model():
    """Conv+ReLU, a depthwise Conv+Clip(0, 6), padded MaxPool, a 1x1 Conv added to the
    pooled map (residual) and multiplied by it, Concat, GlobalAveragePool, Gemm (transB), on
    an odd 11x13 map."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=8,
                         strides=[1, 2]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "w3", "b3"], ["c3"]),
        helper.make_node("Add", ["c3", "p"], ["a"]),
        helper.make_node("Mul", ["a", "p"], ["m"]),
        helper.make_node("Concat", ["a", "m"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"], transB=1),
    ]
    inits = [_init(rng, "w1", 8, 3, 3, 3), _init(rng, "b1", 8, scale=0.1),
             _init(rng, "w2", 8, 1, 3, 3), _init(rng, "b2", 8, scale=0.1),
             _init(rng, "w3", 8, 8, 1, 1), _init(rng, "b3", 8, scale=0.1),
             _init(rng, "w4", 10, 16), _init(rng, "b4", 10, scale=0.1),
             numpy_helper.from_array(np.float32(0), "lo"),
             numpy_helper.from_array(np.float32(6), "hi")]
    return _model(nodes, inits, {"x": [1, 3, 11, 13]}, {"y": [1, 10]})


def one_conv_model(seed, x, weight, **conv_attrs):
    """Conv of ``weight``'s shape on ``x`` (bias, ReLU), GlobalAveragePool, Gemm to 10."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **conv_attrs),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("GlobalAveragePool", ["r1"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1),
    ]
    channels = weight[0]
    inits = [_init(rng, "w1", *weight), _init(rng, "b1", channels, scale=0.1),
             _init(rng, "w2", 10, channels), _init(rng, "b2", 10, scale=0.1)]
    return _model(nodes, inits, {"x": list(x)}, {"y": [1, 10]})


def stem_model():
    """A network's first layer as the window form takes it: Conv 3 -> 16, 3x3, stride 2 on
    32x32 (16x16 outputs, whole vectors of 16)."""
    return one_conv_model(5, (1, 3, 32, 32), (16, 3, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2])


def pointwise_model():
    """A pointwise layer as the pixels form takes it: Conv 8 -> 24, 1x1 on 8x8 (64 pixels,
    whole vectors of 16)."""
    return one_conv_model(6, (1, 8, 8, 8), (24, 8, 1, 1))


def encoder_model():
    """A transformer block's dense layers on 7 tokens: MatMul+bias, ReLU, MatMul+bias, the
    residual Add, and the tokens' products with each other (two activations)."""
    rng = np.random.default_rng(8)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "w2"], ["h4"]),
        helper.make_node("Add", ["h4", "b2"], ["h5"]),
        helper.make_node("Add", ["h5", "x"], ["y"]),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["y", "yt"], ["scores"]),
    ]
    inits = [_init(rng, "w1", 16, 24), _init(rng, "b1", 24, scale=0.1),
             _init(rng, "w2", 24, 16), _init(rng, "b2", 16, scale=0.1)]
    return _model(nodes, inits, {"x": [1, 7, 16]}, {"y": [1, 7, 16], "scores": [1, 7, 7]})


def _model(nodes, inits, inputs, outputs):
    graph = helper.make_graph(
        nodes, "float",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


class Calibration(quantization.CalibrationDataReader):
    def __init__(self, shape, count=4, seed=3):
        rng = np.random.default_rng(seed)
        self.batches = iter([{"x": np.asarray(rng.standard_normal(shape), np.float32)}
                             for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantized(tmp_path, model, shape, dynamic=False, **options):
    source, target = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    onnx.save(model, source)
    if dynamic:
        quantization.quantize_dynamic(source, target, **options)
    else:
        quantization.quantize_static(source, target, Calibration(shape), **options)
    return onnx.load(target)


def run(model, feeds):
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**feeds)
    m.run()
    return mod, [m.get_output(k).numpy() for k in range(m.get_num_outputs())]


def convs(func) -> list:
    return [n for n in func.topo() if n.op == "qnn.conv2d"]


def conv_layouts(func) -> list:
    return [n.attrs.get("kernel_layout") for n in convs(func)]


def operators(mod) -> set:
    return {node.op for node in mod["main"].topo()}


def output_steps(model) -> list:
    """Each graph output's quantization step: the scale of the DequantizeLinear that makes it
    (None for a float output)."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    steps = []
    for out in model.graph.output:
        node = producers[out.name]
        steps.append(float(inits[node.input[1]]) if node.op_type == "DequantizeLinear" else None)
    return steps


def check_against_onnxruntime(model, feeds):
    mod, got = run(model, feeds)
    expected = onnxruntime_outputs(model, feeds)
    for g, e, step in zip(got, expected, output_steps(model)):
        bound = step * (1 + 1e-5) if step is not None else 1e-4 * np.abs(e).max()
        assert np.abs(g - e).max() <= bound, (np.abs(g - e).max(), bound)
        if g.ndim == 2:
            assert (g.argmax(-1) == e.argmax(-1)).all()
    return mod


CNN_CASES = {
    "qdq-u8s8-per-channel": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                                 per_channel=True),
    "qdq-s8s8-symmetric": dict(quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                               extra_options={"ActivationSymmetric": True}),
    "qdq-u8u8-asymmetric-weights": dict(quant_format=QuantFormat.QDQ,
                                        activation_type=QuantType.QUInt8,
                                        weight_type=QuantType.QUInt8, per_channel=True),
    "qoperator-u8s8-per-channel": dict(quant_format=QuantFormat.QOperator,
                                       activation_type=QuantType.QUInt8, per_channel=True),
    "qoperator-u8u8": dict(quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8,
                           weight_type=QuantType.QUInt8),
}


@pytest.mark.parametrize("case", sorted(CNN_CASES))
def test_quantized_cnn_against_onnxruntime(tmp_path, case):
    model = quantized(tmp_path, cnn_model(), (1, 3, 11, 13), **CNN_CASES[case])
    feeds = {"x": np.asarray(np.random.default_rng(11).standard_normal((1, 3, 11, 13)),
                             np.float32)}
    ops = operators(check_against_onnxruntime(model, feeds))
    assert {"qnn.conv2d", "qnn.dense", "qnn.binary", "qnn.global_avg_pool"} <= ops
    assert not ops & {"nn.conv2d", "nn.dense", "nn.global_pool"}, "a float layer is left"


@pytest.mark.parametrize("case", ["qdq-u8s8-per-channel", "qoperator-u8s8-per-channel"])
def test_a_quantized_residual_add_is_a_kernel_of_its_own(tmp_path, case):
    """``relay.fuse.KEPT_APART``: an integer convolution's group ends before the quantized add
    of its residual (the convolution's tile writes back in vectors of its columns, the add of
    its own runs in whole vectors); the float network's add joins its convolution."""
    float_model = cnn_model()
    model = quantized(tmp_path, float_model, (1, 3, 11, 13), **CNN_CASES[case])

    def groups(m):
        mod, params = relay.frontend.from_onnx(m)
        return [[n.op for n in g.nodes] for g in partition(optimize(mod["main"], params))]
    quantized_groups = groups(model)
    assert ["qnn.binary"] in quantized_groups
    assert not any("qnn.conv2d" in g and "qnn.binary" in g for g in quantized_groups)
    assert ["nn.conv2d", "add", "add"] in groups(float_model)     # its bias and the residual


@pytest.mark.parametrize("case", ["qdq-u8s8-per-channel", "qdq-s8s8-symmetric",
                                  "qoperator-u8s8-per-channel"])
def test_quantized_stem_against_onnxruntime(tmp_path, case):
    """A first layer of 3 channels and a 3x3 window runs in the window form (the pixels form
    over its 27 taps: the build's choice on every target, the importer packs it plainly) and
    agrees with onnxruntime."""
    from kernelrpc.compiler.target import Target
    from kernelrpc.relay.strategy import tiles_for
    from kernelrpc.relay.tuning import int8_forms

    model = quantized(tmp_path, stem_model(), (1, 3, 32, 32), **CNN_CASES[case])
    feeds = {"x": np.asarray(np.random.default_rng(12).standard_normal((1, 3, 32, 32)),
                             np.float32)}
    mod = check_against_onnxruntime(model, feeds)
    assert conv_layouts(mod["main"]) == [quant.PACKED]
    for target in ("llvm", "llvm -mcpu=x86-64", "llvm -mcpu=icelake-server",
                   "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"):
        assert conv_layouts(int8_forms(mod["main"], tiles_for(Target(target)))) == \
            [quant.PACKED_WINDOW], target


@pytest.mark.parametrize("case", ["qdq-u8s8-per-channel", "qoperator-u8s8-per-channel"])
def test_quantized_pointwise_layer_against_onnxruntime(tmp_path, case):
    """A pointwise layer of whole vectors of 16 pixels runs in the pixels form (the build's
    choice; the importer packs it by channels, the same weight) and agrees with
    onnxruntime."""
    from kernelrpc.compiler.target import Target
    from kernelrpc.relay.strategy import tiles_for
    from kernelrpc.relay.tuning import int8_forms

    model = quantized(tmp_path, pointwise_model(), (1, 8, 8, 8), **CNN_CASES[case])
    feeds = {"x": np.asarray(np.random.default_rng(13).standard_normal((1, 8, 8, 8)),
                             np.float32)}
    mod = check_against_onnxruntime(model, feeds)
    formed = int8_forms(mod["main"], tiles_for(Target("llvm")))
    assert conv_layouts(mod["main"]) == [quant.PACKED]
    assert conv_layouts(formed) == [quant.PACKED_PIXELS]
    (conv,), (built,) = (convs(f) for f in (mod["main"], formed))
    assert built.inputs[1] is conv.inputs[1]


@pytest.mark.parametrize("case", ["qdq", "qoperator", "dynamic"])
def test_quantized_encoder_against_onnxruntime(tmp_path, case):
    options = {"dynamic": dict(dynamic=True),
               "qdq": dict(quant_format=QuantFormat.QDQ, per_channel=True),
               "qoperator": dict(quant_format=QuantFormat.QOperator)}[case]
    model = quantized(tmp_path, encoder_model(), (1, 7, 16), **options)
    feeds = {"x": np.asarray(np.random.default_rng(12).standard_normal((1, 7, 16)), np.float32)}
    ops = operators(check_against_onnxruntime(model, feeds))
    assert "qnn.dense" in ops and "nn.dense" not in ops


# ------------------------------------------------------------------ kernels against numpy


def build_run(node, inputs, feeds, target="llvm"):
    lib = relay.build(ir.IRModule(ir.Function(inputs, [node])), target=target)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**feeds)
    m.run()
    return m.get_output(0).numpy(), lib


def make(op, inputs, **attrs):
    shape, dtype = get(op).infer(list(inputs), attrs)
    return ir.Node(op, tuple(inputs), attrs, tuple(shape), dtype, "y")


RNG = np.random.default_rng(21)


def integers(dtype, *shape):
    lo, hi = quant.qrange(dtype)
    return RNG.integers(lo, hi + 1, shape).astype(dtype)


@pytest.mark.parametrize("data_dtype,x_zero,weight_dtype,out_dtype,out_zero,groups", [
    ("uint8", 0, "int8", "uint8", 255, 1),
    ("uint8", 255, "int8", "int8", -128, 1),
    ("int8", -128, "int8", "int8", 127, 3),
    ("int8", 127, "int16", "uint8", 0, 1),          # a uint8 weight centered on its zero point
    ("uint8", 131, "int8", "int32", 0, 1),          # ConvInteger's int32 accumulation
])
def test_qconv2d_against_numpy(data_dtype, x_zero, weight_dtype, out_dtype, out_zero, groups):
    data = ir.Node("input", (), {}, (2, 6, 9, 11), data_dtype, "x")
    weight = integers("int8", 9, 6 // groups, 3, 2) if weight_dtype == "int8" else \
        (integers("uint8", 9, 6 // groups, 3, 2).astype(np.int16) - 131)
    attrs = dict(strides=(2, 1), dilation=(1, 2), padding=(1, 0, 2, 1), groups=groups)
    inputs = [data, ir.const(weight), ir.const(np.asarray(x_zero, data_dtype))]
    if out_dtype != "int32":
        lo, hi = quant.qrange(out_dtype)
        inputs += [ir.const(RNG.integers(-3000, 3000, 9).astype(np.int32)),
                   ir.const(np.asarray(RNG.random(9) * 2e-2 + 1e-3, np.float32))]
        attrs.update(out_zero=out_zero, out_min=lo, out_max=hi, out_dtype=out_dtype)
    else:
        attrs.update(out_zero=0, out_min=0, out_max=0, out_dtype="int32")
    node = make("qnn.conv2d", inputs, **attrs)
    x = integers(data_dtype, 2, 6, 9, 11)
    got, _ = build_run(node, [data], {"x": x})
    expected = quant.np_qconv2d([x] + [i.value for i in inputs[1:]], attrs)
    np.testing.assert_array_equal(got, expected)
    if out_dtype != "int32":           # the saturation is reached at both ends
        assert {quant.qrange(out_dtype)[0], quant.qrange(out_dtype)[1]} <= set(got.ravel())


@pytest.mark.parametrize("channels,in_float,bias_in_float", [(100, True, True),
                                                              (200, True, False),
                                                              (300, False, False)])
def test_qconv2d_float_sums_at_their_bound(channels, in_float, bias_in_float):
    """A plain layer's sums are float32 only where every partial sum is an exact integer
    (255 x 255 x 200 = 13.0 M < 2**24), else int32 (300 channels: 19.5 M, whose odd sums
    float32 would round); the output stage adds the bias in float32 only where every sum plus
    the bias is exact too (100 channels: 6.5 M + 6.5 M), else in int32 (200: 13.0 M + 13.0 M);
    each equals numpy's with the products at their largest and a bias that leaves the sum's
    last unit in the output."""
    data = ir.Node("input", (), {}, (1, channels, 2, 3), "uint8", "x")
    weight = np.full((2, channels, 1, 1), 255, np.int16)
    weight[1] = -255
    total = 255 * 255 * channels - 255             # x[0, 0, 0, 0] is 254: an odd sum
    inputs = [data, ir.const(weight), ir.const(np.asarray(0, np.uint8)),
              ir.const(np.asarray([5 - total, total - 9], np.int32)),
              ir.const(np.ones(2, np.float32))]
    attrs = dict(strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), groups=1,
                 out_zero=0, out_min=-128, out_max=127, out_dtype="int8")
    node = make("qnn.conv2d", inputs, **attrs)
    assert quant.sums_exact_in_float(node) == in_float
    assert quant.bias_exact_in_float(node) == bias_in_float
    x = np.full((1, channels, 2, 3), 255, np.uint8)
    x[0, 0, 0, 0] = 254
    got, _ = build_run(node, [data], {"x": x})
    expected = quant.np_qconv2d([x] + [i.value for i in inputs[1:]], attrs)
    np.testing.assert_array_equal(got, expected)
    assert expected[0, :, 0, 0].tolist() == [5, -9]


def requantized_operands(columns, out_dtype):
    """A dense layer's bias and multiplier inputs and output attributes (none for int32)."""
    if out_dtype == "int32":
        return [], dict(out_zero=0, out_min=0, out_max=0, out_dtype="int32")
    lo, hi = quant.qrange(out_dtype)
    return ([ir.const(RNG.integers(-3000, 3000, columns).astype(np.int32)),
             ir.const(np.asarray(RNG.random(columns) * 1e-3, np.float32))],
            dict(out_zero=lo + 5, out_min=lo, out_max=hi, out_dtype=out_dtype))


@pytest.mark.parametrize("data_dtype,x_zero,out_dtype", [("uint8", 0, "int8"),
                                                         ("uint8", 255, "uint8"),
                                                         ("int8", -128, "int32")])
def test_qdense_against_numpy(data_dtype, x_zero, out_dtype):
    rows, depth, columns = 5, 37, 19
    data = ir.Node("input", (), {}, (rows, depth), data_dtype, "x")
    extra, attrs = requantized_operands(columns, out_dtype)
    inputs = [data, ir.const(integers("int8", depth, columns)),
              ir.const(np.asarray(x_zero, np.int32)), *extra]
    node = make("qnn.dense", inputs, **attrs)
    x = integers(data_dtype, rows, depth)
    got, _ = build_run(node, [data], {"x": x})
    np.testing.assert_array_equal(got, quant.np_qdense([x] + [i.value for i in inputs[1:]],
                                                       attrs))


@pytest.mark.parametrize("target,expected", [
    ("llvm -mcpu=cascadelake", "avx512_vnni"), ("llvm -mcpu=znver4", "avx512_vnni"),
    ("llvm -mcpu=skylake-avx512", "avx512bw"), ("llvm -mcpu=haswell", "avx2"),
    ("llvm -mcpu=cascadelake -mattr=-avx512vnni", "avx512bw"),
    ("llvm -mcpu=skylake-avx512 -mattr=-avx512bw", "avx2"),     # zmm floats, ymm bytes
    ("llvm -mcpu=bdver2", ""), ("llvm -mcpu=sandybridge", ""),   # AVX (and FMA), no AVX2
    ("llvm -mcpu=x86-64", ""),
    ("llvm -mtriple=aarch64-linux-gnu", "asimd"),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+dotprod", "dotprod"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76", "dotprod"),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72", "asimd"),
    ("llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp4", "neon"),
    ("llvm -mtriple=armv7-linux-gnueabihf -mattr=+vfp3d16,-neon", ""),
    ("llvm -mtriple=riscv64-linux-gnu -mattr=+m,+a,+f,+d,+c,+v", "")])
def test_int8_dot_is_the_targets_not_the_hosts(target, expected):
    from kernelrpc.compiler.target import Target
    from kernelrpc.compiler.vector_isa import int8_dot

    assert int8_dot(Target(target)) == expected


def test_dynamic_quantize_linear_against_onnxruntime():
    """DynamicQuantizeLinear's three outputs, on values all above zero (the zero point at
    0), all below (at 255) and all zero (the scale 1)."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph([node], "dql", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [3, 5])], [helper.make_tensor_value_info(n, t, s) for n, t, s in (
            ("y", TensorProto.UINT8, [3, 5]), ("s", TensorProto.FLOAT, []),
            ("z", TensorProto.UINT8, []))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    base = np.asarray(RNG.standard_normal((3, 5)), np.float32)
    for x in (base, np.abs(base) + 1, -np.abs(base) - 1, np.zeros_like(base)):
        _, got = run(model, {"x": x})
        for g, e in zip(got, onnxruntime_outputs(model, {"x": x})):
            np.testing.assert_array_equal(g.reshape(e.shape), e)


def test_the_reference_sums_are_exact():
    """The onnxruntime run the tests compare against sums uint8 x int8 products exactly on
    every host, as kernelrpc does: its default kernels on x86 without VNNI saturate each pair
    of products in int16 (255 x 127 twice is 64770)."""
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    b = np.stack([np.full(8, 127), np.full(8, -128)], axis=1).astype(np.int8)
    graph = helper.make_graph(
        [node], "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2])],
        [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feeds = {"a": np.full((1, 8), 255, np.uint8)}
    exact = np.array([[8 * 255 * 127, 8 * 255 * -128]], np.int32)
    np.testing.assert_array_equal(onnxruntime_outputs(model, feeds)[0], exact)
    np.testing.assert_array_equal(run(model, feeds)[1][0], exact)


def test_model_command_marks_the_int8_layers(tmp_path):
    from test_model_command import run_model

    model = quantized(tmp_path, cnn_model(), (1, 3, 11, 13), **CNN_CASES["qdq-u8s8-per-channel"])
    onnx.save(model, tmp_path / "int8.onnx")
    done = run_model("int8.onnx", "--local", "--repeat", "1", "--number", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "int8         4 of 4 conv/dense layers in integers (qnn.conv2d 3, qnn.dense 1)" in \
        done.stdout, done.stdout


def test_refused_forms_are_named():
    """A QLinearConv whose output scale is computed at run time, and a DequantizeLinear of
    int16 (an opset 21 type), are refused by name, not computed some other way."""
    from kernelrpc.relay.errors import UnsupportedOperatorError

    x = np.zeros((1, 2, 3, 3), np.uint8)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    graph = helper.make_graph(
        [node], "qconv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.float32(0.1), "xs"), numpy_helper.from_array(np.uint8(3), "xz"),
         numpy_helper.from_array(np.ones((4, 2, 1, 1), np.int8), "w"),
         numpy_helper.from_array(np.float32(0.2), "ws"), numpy_helper.from_array(np.int8(0), "wz"),
         numpy_helper.from_array(np.uint8(1), "yz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(UnsupportedOperatorError, match="output scale and zero point must be "
                                                       "constant scalars"):
        relay.frontend.from_onnx(model)
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    graph = helper.make_graph(
        [node], "dq", [helper.make_tensor_value_info("x", TensorProto.INT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.float32(0.5), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with pytest.raises(UnsupportedOperatorError, match="DequantizeLinear of int16"):
        relay.frontend.from_onnx(model)
