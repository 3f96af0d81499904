"""Narrow float weights and integer images against onnxruntime: float16 and bfloat16
initializers and constants are widened to float32 at import and computed in float32 (a Cast to
float16 is a cast to float32); a float16 input or output of the graph stays float16 at the
network's boundary (cast to and from float32 inside), a bfloat16 one is refused by name; uint8
and int8 images cast to float32 by the model."""
import platform

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_check import (  # noqa: E402
    N,
    build,
    check_graph,
    compare,
    graph_model,
    kernelrpc_outputs,
    rand,
    run,
    run_model,
)

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay.errors import ModelError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from kernelrpc.runtime.graph_executor import GraphInputError  # noqa: E402

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


#: float16's unit roundoff: rounding a float32 to float16 moves it by at most this fraction
#: of its magnitude (half an ulp), or by half the smallest subnormal (2**-25) near zero
HALF_ROUNDOFF = 2.0 ** -11


def exact_half_model():
    """Every float16 bit pattern through Identity, and Mul, Add and Div by float16 constants:
    float32 holds each float16 product and sum exactly and rounds a quotient finely enough
    (24 >= 2 * 11 + 2 bits) that one rounding to float16 is the correctly rounded float16
    result, so kernelrpc's float32 computation agrees with onnxruntime's float16 bit for bit.
    The Add rounds 1127 ties (to even), the Mul overflows to infinities, the Div makes
    subnormals."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    consts = {"c": np.float16(-7.5), "d": np.float16(0.0999), "e": np.float16(3.0)}
    nodes = [N("Identity", ["x"], ["same"]), N("Mul", ["x", "c"], ["prod"]),
             N("Add", ["x", "d"], ["sum"]), N("Div", ["x", "e"], ["quot"])]
    return graph_model(nodes, {"x": x}, ["same", "prod", "sum", "quot"], consts), {"x": x}


def assert_same_halves(got_all, expect):
    """The same float16 bits (NaNs: NaN, whatever their payload)."""
    for got, ref in zip(got_all, expect, strict=True):
        assert got.dtype == ref.dtype == np.float16
        nan = np.isnan(ref)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], ref.view(np.uint16)[~nan])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86-64 host")
@pytest.mark.parametrize("mcpu", ["x86-64", "haswell"])
def test_float16_inputs_and_outputs_round_as_onnxruntime(mcpu):
    """The float16 input and outputs keep their dtype; the casts at the boundary are
    libgcc's conversion functions without F16C (x86-64) and vcvtph2ps/vcvtps2ph with it."""
    model, feeds = exact_half_model()
    mod, params = relay.frontend.from_onnx(model)
    assert mod["main"].inputs[0].dtype == "float16"
    assert [out.dtype for out in mod["main"].outputs] == ["float16"] * 4
    lib = relay.build(mod, target=f"llvm -mcpu={mcpu}", params=params)
    module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    assert_same_halves(run(module, feeds), onnxruntime_outputs(model, feeds))


def test_a_float16_model_from_the_float16_converter():
    """A float32 CNN (Conv, BatchNormalization, Relu, SiLU, pooling, Gemm, Softmax) turned
    float16 by onnxconverter-common, inputs and outputs included. Its weights and input are
    float16 values, so the float32 original computes what kernelrpc does: each output is
    onnxruntime's float32 result rounded once to float16 (float16's roundoff of each value,
    on top of float32's differences of 1e-5 of the scale). onnxruntime's float16 run rounds
    after each of its nodes: within the node count times float16's roundoff of the scale."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    rng = np.random.default_rng(3)

    def half(*shape, positive=False):
        return rand(rng, *shape, positive=positive).astype(np.float16).astype(np.float32)
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             N("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"]),
             N("Relu", ["n1"], ["r1"]),
             N("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             N("Sigmoid", ["c2"], ["s2"]), N("Mul", ["c2", "s2"], ["a2"]),
             N("GlobalAveragePool", ["a2"], ["p"]), N("Flatten", ["p"], ["f"]),
             N("Gemm", ["f", "wc", "bc"], ["logits"], transB=1),
             N("Softmax", ["logits"], ["prob"], axis=1)]
    inits = {"w1": half(8, 3, 3, 3), "b1": half(8), "g": half(8, positive=True),
             "be": half(8), "mu": half(8), "var": half(8, positive=True),
             "w2": half(6, 8, 3, 3), "wc": half(5, 6), "bc": half(5)}
    x = half(1, 3, 13, 11)
    original = graph_model(nodes, {"x": x}, ["logits", "prob"], inits)
    model = float16.convert_float_to_float16(original, keep_io_types=False)
    assert model.graph.input[0].type.tensor_type.elem_type == F16
    feeds = {"x": x.astype(np.float16)}
    got = run(build(model), feeds)
    for out, ref in zip(got, onnxruntime_outputs(original, {"x": x}), strict=True):
        assert out.dtype == np.float16
        np.testing.assert_allclose(out, ref, rtol=HALF_ROUNDOFF,
                                   atol=2.0 ** -25 + 1e-5 * np.abs(ref).max())
    compare(got, onnxruntime_outputs(model, feeds), tol=len(nodes) * HALF_ROUNDOFF)


def test_float16_and_float32_inputs_side_by_side():
    """Each input keeps its own dtype; the executor refuses a float32 array for the float16
    input, naming the dtype it expects."""
    nodes = [N("Cast", ["b"], ["b16"], to=F16), N("Add", ["a", "b16"], ["s"]),
             N("Cast", ["s"], ["y"], to=F32), N("Identity", ["s"], ["z"])]
    feeds = {"a": rand(RNG, 3, 5).astype(np.float16), "b": rand(RNG, 1, 5)}
    model = graph_model(nodes, feeds, ["y", "z"])
    module = build(model)
    got = run(module, feeds)
    assert [g.dtype for g in got] == [np.float32, np.float16]
    compare(got, onnxruntime_outputs(model, feeds), tol=HALF_ROUNDOFF)
    with pytest.raises(GraphInputError, match="has dtype float32; the network expects "
                                              "float16"):
        module.set_input("a", feeds["a"].astype(np.float32))


def test_a_float16_input_fixed_at_import():
    """``const_inputs`` takes a float16 input's value when float16 holds it exactly."""
    nodes = [N("Mul", ["x", "k"], ["y"])]
    feeds = {"x": rand(RNG, 2, 3).astype(np.float16)}
    model = graph_model(nodes, {**feeds, "k": ((1,), np.float16)}, ["y"])
    got = run(build(model, const_inputs={"k": [0.375]}), feeds)
    k = np.asarray([0.375], np.float16)
    assert_same_halves(got, onnxruntime_outputs(model, {**feeds, "k": k}))
    with pytest.raises(ModelError, match=r"is not exactly a float16 value"):
        relay.frontend.from_onnx(model, const_inputs={"k": [0.1]})


@pytest.mark.parametrize("where", ["input", "output"])
def test_bfloat16_inputs_and_outputs_are_refused(where):
    value_in = helper.make_tensor_value_info("x", BF16 if where == "input" else F32, [2, 3])
    value_out = helper.make_tensor_value_info("y", BF16 if where == "output" else F32, [2, 3])
    cast = N("Cast", ["x"], ["y"], to=BF16 if where == "output" else F32)
    model = helper.make_model(helper.make_graph([cast], "io", [value_in], [value_out]),
                              opset_imports=[helper.make_opsetid("", 13)])
    name = "x" if where == "input" else "y"
    with pytest.raises(ModelError, match=f"{where} '{name}' is bfloat16: kernelrpc's tensors "
                                         "have no bfloat16 dtype"):
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
