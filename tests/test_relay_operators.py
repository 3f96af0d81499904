"""Every operator the ONNX importer supports, compiled and run, against onnxruntime.

Each case is a one-node (or few-node) model built with ``onnx.helper``, seeded random inputs
of odd shapes, weights as initializers; the output must match onnxruntime's within 1e-4 of its
scale (1e-3 for transcendental functions)."""
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from target_families import family_params  # noqa: E402

RNG = np.random.default_rng(7)


def rand(*shape, positive=False):
    value = np.asarray(RNG.standard_normal(shape), np.float32)
    return np.asarray(np.abs(value) + 0.5, np.float32) if positive else value


def run_case(op_type, inputs: dict, attrs=None, inits: dict | None = None, opset=13,
             outputs=1, tol=1e-4, extra_nodes=()):
    inits = inits or {}
    names = list(inputs) + list(inits)
    out_names = [f"y{k}" for k in range(outputs)]
    nodes = [helper.make_node(op_type, names, out_names, name="node", **(attrs or {}))]
    nodes += list(extra_nodes)
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in out_names],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    expect = onnxruntime_outputs(model, inputs)
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**inputs)
    m.run()
    for k, ref in enumerate(expect):
        got = m.get_output(k).numpy()
        assert got.shape == ref.shape, (got.shape, ref.shape)
        scale = max(float(np.abs(ref).max()), 1e-6)
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale)
    return lib


CONV_CASES = [
    dict(x=(1, 3, 11, 13), w=(5, 3, 3, 3), attrs=dict(pads=[1, 1, 1, 1])),
    dict(x=(2, 4, 9, 9), w=(6, 4, 3, 3), attrs=dict(strides=[2, 2], pads=[0, 1, 2, 1])),
    dict(x=(1, 8, 10, 7), w=(8, 1, 3, 3), attrs=dict(group=8, pads=[1, 1, 1, 1])),   # depthwise
    dict(x=(2, 5, 13, 19), w=(5, 1, 3, 3), attrs=dict(group=5, strides=[2, 2], pads=[1, 1, 1, 1])),
    dict(x=(1, 4, 9, 9), w=(8, 1, 5, 5), attrs=dict(group=4, pads=[2, 2, 2, 2])),    # multiplier 2
    dict(x=(1, 6, 9, 9), w=(9, 2, 3, 3), attrs=dict(group=3, dilations=[2, 2])),
    dict(x=(1, 5, 7, 8), w=(7, 5, 1, 1), attrs={}),
    dict(x=(1, 3, 15, 15), w=(4, 3, 5, 5), attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    dict(x=(1, 3, 14, 15), w=(4, 3, 4, 4), attrs=dict(auto_pad="SAME_LOWER", strides=[3, 2])),
    dict(x=(1, 3, 12, 12), w=(4, 3, 7, 7), attrs=dict(auto_pad="VALID", strides=[2, 2])),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c["x"])))
@pytest.mark.parametrize("bias", [False, True])
def test_conv(case, bias):
    inits = {"w": rand(*case["w"])}
    if bias:
        inits["b"] = rand(case["w"][0])
    run_case("Conv", {"x": rand(*case["x"])}, case["attrs"], inits)


@pytest.mark.parametrize("attrs,w", [
    (dict(strides=[2, 2]), (4, 3, 3, 3)),
    (dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), (4, 3, 3, 3)),
    (dict(strides=[1, 1], pads=[0, 1, 0, 1], dilations=[2, 2]), (4, 5, 3, 3)),
    (dict(strides=[2, 2], group=2), (4, 3, 4, 4)),
    (dict(strides=[2, 2], output_shape=[14, 14]), (4, 3, 3, 3)),
    (dict(strides=[2, 2], auto_pad="SAME_UPPER"), (4, 2, 3, 3)),
    (dict(strides=[2, 2]), (4, 1, 2, 2)),                       # one tap per phase: a 1x1
    (dict(strides=[2, 2], pads=[1, 1, 1, 1]), (4, 6, 4, 4)),     # a decoder's 2x upsampling
    (dict(strides=[3, 2], pads=[2, 0, 1, 3], output_padding=[2, 1]), (4, 3, 4, 5)),
    (dict(strides=[3, 3]), (4, 2, 2, 2)),                       # a kernel smaller than the stride
    (dict(strides=[2, 3], group=2, output_shape=[14, 16]), (4, 2, 3, 2)),
    (dict(strides=[2, 2], dilations=[2, 1]), (4, 3, 3, 3)),     # dilated: zeros upsampled
])
def test_conv_transpose(attrs, w):
    lib = run_case("ConvTranspose", {"x": rand(1, 4, 7, 6)}, attrs,
                   {"w": rand(*w), "b": rand(w[1] * attrs.get("group", 1))})
    (conv,) = [n for n in lib.ir_mod["main"].topo() if n.op == "nn.conv2d"]
    strided = max(attrs.get("strides", [1])) > 1 and set(attrs.get("dilations", [1])) == {1}
    assert ("upsample" not in conv.attrs) == strided      # sub-pixel: no zeros multiplied


@pytest.mark.parametrize("attrs", [{}, dict(transB=1), dict(transA=1, alpha=0.5, beta=2.0)])
def test_gemm(attrs):
    a = rand(7, 5) if not attrs.get("transA") else rand(5, 7)
    b = rand(9, 5) if attrs.get("transB") else rand(5, 9)
    run_case("Gemm", {"a": a}, attrs, {"b": b, "c": rand(9)})


def test_gemm_with_both_operands_computed():
    run_case("Gemm", {"a": rand(3, 4), "b": rand(6, 4)}, dict(transB=1))


@pytest.mark.parametrize("a,b,const", [((3, 7), (7, 5), True), ((2, 3, 7), (7, 4), True),
                                       ((2, 3, 4, 5), (2, 1, 5, 6), False), ((7,), (7, 3), True),
                                       ((4, 7), (7,), False)])
def test_matmul(a, b, const):
    if const:
        run_case("MatMul", {"a": rand(*a)}, inits={"b": rand(*b)})
    else:
        run_case("MatMul", {"a": rand(*a), "b": rand(*b)})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("shapes", [((2, 3, 5), (2, 3, 5)), ((2, 3, 5), (3, 1)),
                                    ((1, 4, 1, 3), (2, 1, 5, 1)), ((3,), ())])
def test_broadcasting_binary(op, shapes):
    a = rand(*shapes[0])
    b = rand(*shapes[1], positive=op == "Div")
    run_case(op, {"a": a, "b": b})


def test_pow_and_variadic_sum_of_three():
    run_case("Pow", {"a": rand(3, 4, positive=True), "b": rand(3, 4)}, tol=1e-3)
    run_case("Sum", {"a": rand(3, 4), "b": rand(4), "c": rand(3, 1)})


@pytest.mark.parametrize("op,attrs,opset", [
    ("Relu", {}, 13), ("Sigmoid", {}, 13), ("Tanh", {}, 13), ("LeakyRelu", dict(alpha=0.2), 13),
    ("HardSigmoid", dict(alpha=0.3, beta=0.4), 13), ("HardSwish", {}, 14), ("Exp", {}, 13),
    ("Neg", {}, 13), ("Abs", {}, 13), ("Floor", {}, 13), ("Ceil", {}, 13),
    ("Clip", dict(min=-0.5, max=0.7), 9), ("Identity", {}, 13), ("Dropout", {}, 13),
])
def test_unary(op, attrs, opset):
    run_case(op, {"x": rand(2, 3, 7, 5) * 3}, attrs, opset=opset, tol=1e-3)


def test_clip_as_relu6_with_constant_inputs():
    run_case("Clip", {"x": rand(1, 4, 5, 5) * 8}, inits={"lo": np.float32(0), "hi": np.float32(6)})


def test_prelu_sqrt_log_reciprocal():
    run_case("PRelu", {"x": rand(1, 4, 3, 3)}, inits={"s": rand(4, 1, 1)})
    for op in ("Sqrt", "Log", "Reciprocal"):
        run_case(op, {"x": rand(3, 5, positive=True)}, tol=1e-3)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 13), (1, 11), (0, 9)])
def test_softmax(op, axis, opset):
    run_case(op, {"x": rand(3, 4, 5) * 4}, dict(axis=axis), opset=opset, tol=1e-3)


def test_batch_normalization_alone_and_after_a_convolution():
    stats = {"s": rand(4), "b": rand(4), "m": rand(4), "v": rand(4, positive=True)}
    run_case("BatchNormalization", {"x": rand(2, 4, 5, 3)}, dict(epsilon=1e-3), stats)
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    bn = helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y0"])
    graph = helper.make_graph(
        [conv, bn], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in dict(stats, w=rand(4, 3, 3, 3)).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, params=params)
    assert [k["fused"] for k in lib.executor["kernels"]] == [["nn.conv2d", "add"]]   # folded
    x = rand(1, 3, 6, 6)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input("x", x)
    m.run()
    ref = onnxruntime_outputs(model, {"x": x})[0]
    np.testing.assert_allclose(m.get_output(0).numpy(), ref, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[5, 5], strides=[1, 1])),
])
def test_pooling(op, attrs):
    run_case(op, {"x": rand(2, 3, 11, 10)}, attrs)


@pytest.mark.parametrize("op,dtype,tail,attrs", [
    ("MaxPool", np.uint8, "Cast", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", np.float32, None, dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", np.int8, "Cast", dict(kernel_shape=[2, 2], strides=[1, 1], pads=[0, 1, 1, 0])),
    ("AveragePool", np.float32, "Relu", dict(kernel_shape=[3, 3], strides=[1, 1],
                                             pads=[1, 1, 1, 1])),
    ("MaxPool", np.float32, None, dict(kernel_shape=[3, 3], strides=[2, 2])),   # 15 columns
    ("MaxPool", np.uint8, "Cast", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
])
def test_pooling_in_vectors_of_columns(op, dtype, tail, attrs):
    """The pooling record: vectors of 16 or 32 output columns (a row they do not divide ends
    in a shorter vector), the taps unrolled around them (the padding tests of the border taps
    per lane), an elementwise tail computed in the same vectors; against onnxruntime, 8-bit
    maps included."""
    x = (RNG.integers(-128, 128, (1, 5, 31, 32)) if dtype == np.int8 else
         RNG.integers(0, 256, (1, 5, 31, 32)) if dtype == np.uint8 else rand(1, 5, 31, 32))
    x = np.asarray(x, dtype)
    nodes = [helper.make_node(op, ["x"], ["p" if tail else "y"], **attrs)]
    if tail:
        nodes.append(helper.make_node(tail, ["p"], ["y"], **(
            {"to": TensorProto.FLOAT} if tail == "Cast" else {})))
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info(
            "x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    assert re.search(r"(max_pool2d|avg_pool2d_sum)\[ramp\(", lib.lib.get_source("lowered"))
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), onnxruntime_outputs(model, {"x": x})[0],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pooling(op):
    run_case(op, {"x": rand(2, 5, 7, 9)})


def test_lrn():
    run_case("LRN", {"x": rand(1, 7, 5, 4)}, dict(size=5, alpha=1e-2, beta=0.75, bias=2.0), tol=1e-3)
    run_case("LRN", {"x": rand(1, 6, 3, 3)}, dict(size=3), tol=1e-3)


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("shape, attrs", [
    ((1, 12, 9, 23), dict(size=5, alpha=1e-2, beta=0.75, bias=1.0)),
    ((2, 7, 5, 37), dict(size=3, alpha=3e-2, beta=1.3, bias=2.5)),
    ((1, 20, 3, 17), dict(size=17, alpha=1e-1, beta=0.5, bias=1.0))])
def test_lrn_on_every_width_is_onnxruntime_s(shape, attrs, target):
    """LRN as ``x * exp(-beta * log(base))`` in vectors (relay/op/nn.py): windows written out
    (the edge channels' windows cut) and one past ``LRN_WRITTEN_OUT`` (its own sum stage);
    rows of whole vectors and a short last one; bases far from 1. Each element within
    ``(|beta ln base| + 4) 2^-23`` of the float64 result (onnxruntime's own pow is less
    exact: 3.7e-6 in the second case), and within 5e-6 of onnxruntime's."""
    x = (np.random.default_rng(3).standard_normal(shape) * 30).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("LRN", ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (expect,) = onnxruntime_outputs(model, {"x": x})
    mod, params = relay.frontend.from_onnx(model)
    m = graph_executor.GraphModule(
        relay.build(mod, target=target, params=params)["default"](kernelrpc.cpu(0)))
    m.set_input(x=x)
    m.run()
    got = m.get_output(0).numpy().astype(np.float64)
    squares = np.pad(x.astype(np.float64) ** 2,
                     [(0, 0), ((attrs["size"] - 1) // 2, attrs["size"] // 2), (0, 0), (0, 0)])
    window = sum(squares[:, k:k + shape[1]] for k in range(attrs["size"]))
    base = attrs["bias"] + attrs["alpha"] / attrs["size"] * window
    exact = x / base ** attrs["beta"]
    bound = (np.abs(attrs["beta"] * np.log(base)) + 4) * 2.0 ** -23
    assert np.all(np.abs(got - exact) <= bound * np.abs(exact))
    np.testing.assert_allclose(got, expect, rtol=5e-6, atol=1e-30)


@pytest.mark.parametrize("op,attrs,opset", [
    ("ReduceMean", dict(axes=[2, 3]), 13), ("ReduceMean", dict(axes=[1], keepdims=0), 13),
    ("ReduceMax", dict(axes=[-1]), 13), ("ReduceMin", {}, 13),
])
def test_reduce(op, attrs, opset):
    run_case(op, {"x": rand(2, 3, 4, 5)}, attrs, opset=opset)


def test_reduce_with_axes_input():
    run_case("ReduceSum", {"x": rand(2, 3, 4)}, dict(keepdims=0), {"axes": np.array([0, 2])})
    run_case("ReduceMean", {"x": rand(2, 3, 4)}, {}, {"axes": np.array([1])}, opset=18)


def test_flatten_reshape_transpose_squeeze_unsqueeze():
    x = rand(2, 3, 4, 5)
    run_case("Flatten", {"x": x}, dict(axis=2))
    run_case("Reshape", {"x": x}, inits={"s": np.array([0, -1, 5], np.int64)})
    run_case("Transpose", {"x": x}, dict(perm=[0, 2, 3, 1]))
    run_case("Transpose", {"x": x})
    run_case("Squeeze", {"x": rand(3, 1, 4, 1)}, inits={"a": np.array([1, -1], np.int64)})
    run_case("Squeeze", {"x": rand(3, 1, 4, 1)}, dict(axes=[1]), opset=11)
    run_case("Unsqueeze", {"x": rand(3, 4)}, inits={"a": np.array([0, 3], np.int64)})


def test_concat_and_split():
    run_case("Concat", {"a": rand(2, 3, 4), "b": rand(2, 1, 4), "c": rand(2, 5, 4)}, dict(axis=1))
    run_case("Split", {"x": rand(2, 7, 3)}, dict(axis=1), {"s": np.array([2, 5], np.int64)},
             outputs=2)
    run_case("Split", {"x": rand(6, 3)}, dict(axis=0), outputs=3)
    run_case("Split", {"x": rand(7, 3)}, dict(axis=0, num_outputs=2), opset=18, outputs=2)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, -1], [0, 2], [1, 1]), ([-1], [-100], [1], [-2]), ([0], [100], [2], [3]),
])
def test_slice(starts, ends, axes, steps):
    run_case("Slice", {"x": rand(4, 5, 6)}, inits={
        "s": np.array(starts, np.int64), "e": np.array(ends, np.int64),
        "a": np.array(axes, np.int64), "t": np.array(steps, np.int64)})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(mode):
    run_case("Pad", {"x": rand(1, 2, 4, 5)}, dict(mode=mode),
             {"p": np.array([0, 0, 1, 2, 0, 1, 3, 1], np.int64), "v": np.float32(0.5)}
             if mode == "constant" else {"p": np.array([0, 0, 1, 2, 0, 1, 3, 1], np.int64)})
    run_case("Pad", {"x": rand(1, 2, 4, 5)}, dict(mode=mode, pads=[0, 0, 1, 1, 0, 0, 2, 1]),
             opset=9)


def test_shape_arithmetic_is_folded():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as exporters write flatten."""
    shape = helper.make_node("Shape", ["x"], ["sh"])
    gather = helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0)
    unsq = helper.make_node("Unsqueeze", ["n", "ax"], ["n1"])
    concat = helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0)
    reshape = helper.make_node("Reshape", ["x", "target"], ["r"])
    cast = helper.make_node("Cast", ["r"], ["y0"], to=TensorProto.FLOAT)
    const = helper.make_node("ConstantOfShape", ["cshape"], ["ones"],
                             value=numpy_helper.from_array(np.array([1.5], np.float32)))
    add = helper.make_node("Add", ["y0", "ones"], ["y1"])
    inits = {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "cshape": np.array([3, 20], np.int64)}
    graph = helper.make_graph(
        [shape, gather, unsq, concat, reshape, cast, const, add], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = relay.frontend.from_onnx(model)
    ops = [n.op for n in mod["main"].topo()]
    assert "take" not in ops and ops.count("reshape") == 1
    lib = relay.build(mod, params=params)
    x = rand(3, 4, 5)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), x.reshape(3, 20) + 1.5)


def test_gather_on_activations():
    run_case("Gather", {"x": rand(5, 6)}, dict(axis=1), {"i": np.array([[0, 5], [-1, 2]], np.int64)})


@pytest.mark.parametrize("attrs", [
    dict(mode="nearest"),
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    dict(mode="linear"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    dict(mode="linear", coordinate_transformation_mode="asymmetric"),
])
def test_resize_by_scales(attrs):
    run_case("Resize", {"x": rand(1, 2, 5, 4)}, attrs,
             {"roi": np.array([], np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)})


def test_resize_by_sizes_and_upsample():
    run_case("Resize", {"x": rand(1, 2, 5, 4)}, dict(mode="linear"),
             {"roi": np.array([], np.float32), "sc": np.array([], np.float32),
              "sz": np.array([1, 2, 7, 9], np.int64)})
    run_case("Upsample", {"x": rand(1, 2, 3, 4)}, dict(mode="nearest"),
             {"sc": np.array([1, 1, 2, 2], np.float32)}, opset=9)


def test_cast_and_constant():
    run_case("Cast", {"x": rand(3, 4) * 10}, dict(to=TensorProto.FLOAT))
    const = helper.make_node("Constant", [], ["k"], value_floats=[1.0, 2.0, 3.0])
    graph = helper.make_graph(
        [const, helper.make_node("Mul", ["x", "k"], ["y0"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, params=params)
    x = rand(2, 3)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input("x", x)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), x * [1, 2, 3])
