"""LSTM, GRU and RNN (frontend/onnx_recurrent.py, op/recurrent.py) compiled and run against
onnxruntime: odd sizes, forward, reverse and bidirectional, initial states, sequence lengths,
both layouts, every activation, clip, the GRU's two reset forms, LSTM peepholes and the coupled
input-forget gate; the forms kernelrpc refuses are refused by name."""
import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402
from onnx_check import _ir_version, opsets, rand, run_model  # noqa: E402

RNG = np.random.default_rng(23)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def layer_model(op, steps=5, batch=3, width=7, hidden=5, attrs=None, opset=14, bias=True,
                initial=False, lens=None, peephole=False, outputs=None, runtime=()):
    """A one-layer model and its feeds; ``runtime`` names the optional inputs fed at run time
    (initial states, sequence_lens) rather than stored as initializers."""
    attrs = dict(attrs or {})
    layout = attrs.get("layout", 0)
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    g = GATES[op]
    x_shape = (steps, batch, width) if layout == 0 else (batch, steps, width)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    feeds = {"X": rand(RNG, *x_shape)}
    values = {"W": rand(RNG, dirs, g * hidden, width) * np.float32(0.5),
              "R": rand(RNG, dirs, g * hidden, hidden) * np.float32(0.5)}
    optional = {"B": rand(RNG, dirs, 2 * g * hidden) if bias else None,
                "sequence_lens": None if lens is None else np.asarray(lens, np.int32),
                "initial_h": rand(RNG, *state) if initial else None}
    if op == "LSTM":
        optional["initial_c"] = rand(RNG, *state) if initial else None
        optional["P"] = rand(RNG, dirs, 3 * hidden) if peephole else None
    names = ["X", "W", "R"]
    for name, value in optional.items():
        names.append(name if value is not None else "")
        if value is not None:
            (feeds if name in runtime else values)[name] = value
    while names[-1] == "":
        names.pop()
    out_names = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    node = helper.make_node(op, names, out_names, name="layer", hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node], "layer",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in out_names if o],
        [numpy_helper.from_array(v, n) for n, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def check_layer(op, tol=1e-5, **kw):
    model, feeds = layer_model(op, **kw)
    return run_model(model, feeds, tol=tol)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions(op, direction):
    check_layer(op, attrs={"direction": direction}, initial=True)
