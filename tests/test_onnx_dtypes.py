"""Narrow float weights and integer images against onnxruntime: float16 and bfloat16
initializers and constants are widened to float32 at import and computed in float32 (a Cast to
float16 is a cast to float32), a float16 or bfloat16 input or output of the graph is refused by
name; uint8 and int8 images cast to float32 by the model."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_check import (  # noqa: E402
    N,
    check_graph,
    compare,
    graph_model,
    kernelrpc_outputs,
    rand,
    run_model,
)

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay.errors import ModelError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(53)
F16, BF16, F32 = TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT


def test_float16_and_bfloat16_weights_cast_to_float():
    """Weights stored narrow, each cast to float32 where it is read (the storage-only form):
    the same values as onnxruntime's, exactly."""
    nodes = [N("Cast", ["w16"], ["w"], to=F32),
             N("Cast", ["b16"], ["b"], to=F32),
             N("Constant", [], ["k16"], value=helper.make_tensor(
                 "k", F16, [1], np.asarray([0.3], np.float16).view(np.uint16).tolist(),
                 raw=False)),
             N("Cast", ["k16"], ["k"], to=F32),
             N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 1]),
             N("Mul", ["c", "k"], ["y"])]
    w16 = rand(RNG, 6, 3, 3, 3).astype(np.float16)
    model = graph_model(nodes, {"x": rand(RNG, 1, 3, 11, 9)}, ["y"], {"w16": w16})
    bias = helper.make_tensor("b16", BF16, [6], rand(RNG, 6).tolist())
    model.graph.initializer.append(bias)
    run_model(model, {"x": rand(RNG, 1, 3, 11, 9)})


def _half_network(narrow: bool):
    """``x`` (float32) -> Cast to float16 -> Conv, Relu, MaxPool, Gemm in float16 (weights
    float16) -> Cast to float32, as float16 converters write a model with float32 inputs and
    outputs; or, ``narrow`` False, its float32 twin (the same weights widened, no Casts)."""
    rng = np.random.default_rng(7)          # the same weights and input for both forms

    def weight(*shape):
        value = rand(rng, *shape).astype(np.float16)
        return value if narrow else value.astype(np.float32)
    inits = {"w": weight(8, 3, 3, 3), "b": weight(8), "wc": weight(5, 8 * 4 * 4),
             "bc": weight(5)}
    body = [N("Conv", ["h", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            N("Relu", ["c"], ["r"]),
            N("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
            N("Flatten", ["p"], ["f"]),
            N("Gemm", ["f", "wc", "bc"], ["g" if narrow else "y"], transB=1)]
    if narrow:
        body = [N("Cast", ["x"], ["h"], to=F16)] + body + [N("Cast", ["g"], ["y"], to=F32)]
    else:
        body = [N("Identity", ["x"], ["h"])] + body
    x = rand(rng, 1, 3, 8, 8)
    return graph_model(body, {"x": x}, ["y"], inits), {"x": x}


def test_a_float16_network_computes_in_float32():
    """kernelrpc's outputs of the float16 network are onnxruntime's of its float32 twin (to
    float32's precision), and within float16's precision of onnxruntime's float16 run."""
    model, feeds = _half_network(narrow=True)
    twin, _ = _half_network(narrow=False)
    got = kernelrpc_outputs(model, feeds)
    compare(got, onnxruntime_outputs(twin, feeds), tol=1e-5)
    compare(got, onnxruntime_outputs(model, feeds), tol=1e-2)


@pytest.mark.parametrize("where,elem", [("input", F16), ("output", F16), ("input", BF16)])
def test_narrow_float_inputs_and_outputs_are_refused(where, elem):
    value_in = helper.make_tensor_value_info("x", elem if where == "input" else F32, [2, 3])
    value_out = helper.make_tensor_value_info("y", elem if where == "output" else F32, [2, 3])
    cast = N("Cast", ["x"], ["y"], to=elem if where == "output" else F32)
    model = helper.make_model(helper.make_graph([cast], "io", [value_in], [value_out]),
                              opset_imports=[helper.make_opsetid("", 13)])
    name = {F16: "float16", BF16: "bfloat16"}[elem]
    with pytest.raises(ModelError, match=f"{where} '{'x' if where == 'input' else 'y'}' is "
                                         f"{name}: kernelrpc computes float16 and bfloat16 in "
                                         "float32"):
        relay.frontend.from_onnx(model)


@pytest.mark.parametrize("dtype,elem", [(np.uint8, TensorProto.UINT8),
                                        (np.int8, TensorProto.INT8)])
def test_integer_image_inputs(dtype, elem):
    """An image of bytes normalized by the model: Cast, subtract the mean, scale, Conv."""
    info = np.iinfo(dtype)
    image = RNG.integers(info.min, info.max + 1, (1, 3, 13, 11)).astype(dtype)
    nodes = [N("Cast", ["image"], ["f"], to=F32),
             N("Sub", ["f", "mean"], ["centered"]),
             N("Mul", ["centered", "scale"], ["x"]),
             N("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"mean": np.asarray([123.7, 116.3, 103.5], np.float32).reshape(1, 3, 1, 1),
             "scale": np.asarray([0.0171, 0.0175, 0.0174], np.float32).reshape(1, 3, 1, 1),
             "w": rand(RNG, 4, 3, 3, 3)}
    mod, _ = relay.frontend.from_onnx(graph_model(nodes, {"image": image}, ["y"], inits))
    assert mod["main"].inputs[0].dtype == np.dtype(dtype).name
    check_graph(nodes, {"image": image}, inits=inits)
