"""Transformer layers as exporters write them: a long row's softmax and reductions in vectors,
batched MatMul, GELU by Erf and by Tanh, LayerNormalization; whole encoders (BERT-style, ViT-style,
GPT-2-style) against onnxruntime, on every vector width the host runs."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay import testing  # noqa: E402
from target_families import family_params  # noqa: E402
from test_relay_conv_channels import run  # noqa: E402


def _softmax_model(shape, axis, log):
    node = helper.make_node("LogSoftmax" if log else "Softmax", ["x"], ["y"], axis=axis)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                         None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("shape, axis, log", [((2, 3, 197), -1, False), ((5, 33), -1, True),
                                              ((1, 4, 7, 64), 3, False), ((3, 40, 6), 1, False)])
def test_a_long_row_s_softmax_is_onnxruntime_s(shape, axis, log, target):
    """Rows of 33 and 197 (partial lanes with a ragged last chunk), whole chunks (64), and a
    softmax along another axis (the plain schedule); values far from 0 (the maximum is
    subtracted first)."""
    model = _softmax_model(shape, axis, log)
    x = (np.random.default_rng(0).standard_normal(shape) * 30 + 50).astype("float32")
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=target, params=params)
    (expect,) = testing.onnxruntime_outputs(model, {"x": x})
    np.testing.assert_allclose(run(lib, {"x": x}), expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("op, shape, axes, keepdims", [
    ("ReduceMean", (3, 37), [-1], 1), ("ReduceMax", (2, 3, 37), [2], 0),
    ("ReduceMin", (2, 3, 5, 7), [2, 3], 1), ("ReduceSum", (4, 2, 3, 8), [1, 2, 3], 0),
    ("GlobalAveragePool", (2, 3, 7, 9), None, None), ("GlobalMaxPool", (1, 5, 13, 13), None,
                                                      None)])
def test_a_long_row_s_reduction_is_onnxruntime_s(op, shape, axes, keepdims, target):
    """Reductions over the trailing axes of rows of 32 or more (their partial lanes,
    relay/op/rows.py), the last vector short, one axis and several, the reduced axes kept
    and dropped; global pooling of maps of 32 pixels or more."""
    if op == "ReduceSum":                    # opset 13's axes are an input
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        inits = [onnx.numpy_helper.from_array(np.array(axes, np.int64), "axes")]
    elif op.startswith("Global"):
        node, inits = helper.make_node(op, ["x"], ["y"]), []
    else:
        node, inits = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims), []
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                         None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = (np.random.default_rng(1).standard_normal(shape) * 30 + 50).astype("float32")
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=target, params=params)
    (expect,) = testing.onnxruntime_outputs(model, {"x": x})
    np.testing.assert_allclose(run(lib, {"x": x}), expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("kind", ["bert", "vit", "gpt2"])
def test_a_transformer_is_onnxruntime_s(kind, target):
    seq = 197 if kind == "vit" else 37
    model = testing.transformer(kind, seq=seq, width=64, heads=4, layers=1, ffn=2)
    feeds = testing.model_input(model)
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=target, params=params)
    (expect,) = testing.onnxruntime_outputs(model, feeds)
    got = run(lib, feeds)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-4 * np.abs(expect).max())
