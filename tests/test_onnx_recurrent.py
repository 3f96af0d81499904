"""LSTM, GRU and RNN (frontend/onnx_recurrent.py, op/recurrent.py) compiled and run against
onnxruntime: odd sizes, forward, reverse and bidirectional, initial states, sequence lengths,
both layouts, every activation, clip, the GRU's two reset forms, LSTM peepholes and the coupled
input-forget gate, batch rows in groups; ONNX's own node cases; a CRNN recognizer on the host and
on an emulated aarch64 board; the forms kernelrpc refuses are refused by name."""
import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from onnx import helper, numpy_helper  # noqa: E402
from onnx_check import _ir_version, kernelrpc_outputs, opsets, rand, run_model  # noqa: E402
from test_relay_emulated import board_session, run_network, tracker  # noqa: E402,F401

from kernelrpc import relay  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.errors import KernelError  # noqa: E402
from kernelrpc.relay.errors import ModelError, UnsupportedOperatorError  # noqa: E402
from kernelrpc.relay.op.recurrent import MAX_STEPS  # noqa: E402
from kernelrpc.relay.testing import Builder, onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(23)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def layer_values(op, steps=5, batch=3, width=7, hidden=5, directions=1, bias=True,
                 initial=False, lens=None, peephole=False) -> dict:
    """Seeded inputs and weights of a layer, time first (``layout`` 0); None where absent."""
    g = GATES[op]
    state = (directions, batch, hidden)
    values = {"X": rand(RNG, steps, batch, width),
              "W": rand(RNG, directions, g * hidden, width) * np.float32(0.5),
              "R": rand(RNG, directions, g * hidden, hidden) * np.float32(0.5),
              "B": rand(RNG, directions, 2 * g * hidden) if bias else None,
              "sequence_lens": None if lens is None else np.asarray(lens, np.int32),
              "initial_h": rand(RNG, *state) if initial else None}
    if op == "LSTM":
        values["initial_c"] = rand(RNG, *state) if initial else None
        values["P"] = rand(RNG, directions, 3 * hidden) if peephole else None
    return values


def layer_model(op, values, attrs, opset=14, outputs=None, runtime=()):
    """A one-layer model and its feeds. X and the ``runtime`` names (initial states,
    sequence_lens) are fed; the other values are initializers. With ``layout`` 1, X and the
    states are given batch first."""
    layout = attrs.get("layout", 0)
    names, feeds, inits = [], {}, {}
    for name, value in values.items():
        names.append(name if value is not None else "")
        if value is None:
            continue
        if layout == 1 and name in ("X", "initial_h", "initial_c"):
            value = np.ascontiguousarray(value.swapaxes(0, 1))
        (feeds if name == "X" or name in runtime else inits)[name] = value
    while names[-1] == "":
        names.pop()
    out_names = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    hidden = values["R"].shape[-1]
    node = helper.make_node(op, names, out_names, name="layer", hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node], "layer",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in out_names if o],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), feeds


def check_layer(op, attrs=None, tol=1e-5, opset=14, outputs=None, runtime=(), **sizes):
    """The layer compiled and run against onnxruntime; ``layout`` 1, which onnxruntime's CPU
    kernels refuse, against onnxruntime's answer for the same layer time first (ONNX defines
    one as the other transposed)."""
    attrs = dict(attrs or {})
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    values = layer_values(op, directions=directions, **sizes)
    model, feeds = layer_model(op, values, attrs, opset, outputs, runtime)
    if attrs.get("layout", 0) == 0:
        return run_model(model, feeds, tol=tol)
    time_first, ref_feeds = layer_model(op, values, {**attrs, "layout": 0}, opset, outputs,
                                        runtime)
    expect = onnxruntime_outputs(time_first, ref_feeds)
    got = kernelrpc_outputs(model, feeds)
    assert len(got) == len(expect)
    for out, ref in zip(got, expect):
        ref = np.transpose(ref, (2, 0, 1, 3)) if ref.ndim == 4 else ref.swapaxes(0, 1)
        assert out.shape == ref.shape, (out.shape, ref.shape)
        scale = max(float(np.abs(ref).max()), 1e-6)
        np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * scale)
    return got


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions(op, direction):
    check_layer(op, attrs={"direction": direction}, initial=True)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("opset", [o for o in opsets("LSTM") if o >= 9])
def test_opsets(op, opset):
    attrs = {"direction": "bidirectional"}
    if opset >= 14:
        attrs["layout"] = 1
    check_layer(op, attrs=attrs, initial=True, lens=[5, 2, 4], opset=opset)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
def test_run_time_states_and_lengths(op, layout):
    """Initial states and sequence lengths fed at run time; lengths of 0, 1 and full, the
    reverse direction starting at each sequence's own end."""
    check_layer(op, steps=6, batch=4, attrs={"direction": "bidirectional", "layout": layout},
                initial=True, lens=[6, 0, 1, 3],
                runtime=("initial_h", "initial_c", "sequence_lens"))


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_constant_lengths_without_bias_or_states(direction):
    check_layer("GRU", attrs={"direction": direction}, bias=False, lens=[2, 5, 3])


ALL_ACTIVATIONS = [("Sigmoid", [], []), ("Tanh", [], []), ("Relu", [], []),
                   ("HardSigmoid", [], []), ("HardSigmoid", [0.3], [0.4]),
                   ("LeakyRelu", [], []), ("LeakyRelu", [0.2], []),
                   ("ThresholdedRelu", [0.1], []), ("ScaledTanh", [1.5], [0.7]),
                   ("Affine", [0.6], [0.1]), ("Elu", [], []), ("Elu", [0.4], []),
                   ("Softsign", [], []), ("Softplus", [], [])]


@pytest.mark.parametrize("name,alpha,beta", ALL_ACTIVATIONS, ids=str)
def test_rnn_activation(name, alpha, beta):
    attrs = {"activations": [name]}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    check_layer("RNN", attrs=attrs, initial=True, tol=1e-4)


def test_activations_per_direction_take_alphas_in_order():
    """Each of (f, g, h) of each direction its own; the alphas and betas consumed in order by
    the activations that take them."""
    attrs = {"direction": "bidirectional",
             "activations": ["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "LeakyRelu", "Affine"],
             "activation_alpha": [0.25, 0.3, 0.9], "activation_beta": [0.45, -0.1]}
    check_layer("LSTM", attrs=attrs, initial=True)
    check_layer("GRU", attrs={"direction": "bidirectional",
                              "activations": ["Sigmoid", "ScaledTanh", "HardSigmoid", "Elu"],
                              "activation_alpha": [1.2, 0.3, 0.8],
                              "activation_beta": [0.9, 0.55]}, initial=True)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_clip(op):
    """A threshold small enough to bind on most gate inputs."""
    check_layer(op, attrs={"clip": 0.4, "direction": "bidirectional"}, initial=True)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_linear_before_reset(lbr):
    check_layer("GRU", attrs={"linear_before_reset": lbr, "direction": "bidirectional"},
                initial=True, lens=[5, 3, 1], runtime=("sequence_lens",))


def test_lstm_peephole_and_input_forget():
    check_layer("LSTM", attrs={"direction": "bidirectional"}, initial=True, peephole=True)
    check_layer("LSTM", attrs={"input_forget": 1}, initial=True, peephole=True, lens=[4, 5, 2])


@pytest.mark.parametrize("outputs", [["", "Y_h"], ["Y"], ["", "", "Y_c"], ["", "Y_h", "Y_c"]])
def test_some_outputs(outputs):
    check_layer("LSTM", attrs={"direction": "reverse"}, outputs=outputs, lens=[3, 5, 1])


def test_long_sequence_and_wide_layer():
    """A sequence long enough that errors would accumulate; a hidden size past a vector."""
    check_layer("LSTM", steps=97, batch=2, width=19, hidden=37,
                attrs={"direction": "bidirectional"}, initial=True, tol=1e-4)


def _refused(op, match, attrs=None, **kw):
    values = layer_values(op, **kw)
    model, _ = layer_model(op, values, attrs or {})
    with pytest.raises(UnsupportedOperatorError, match=match):
        relay.frontend.from_onnx(model)


@pytest.mark.parametrize("attrs,match", [
    ({"activations": ["Gelu"]}, "activation 'Gelu'"),
    ({"activations": ["Tanh", "Tanh"]}, "activations lists 2 functions"),
    ({"activations": ["ThresholdedRelu"]}, "ThresholdedRelu without its activation_alpha"),
    ({"activations": ["ScaledTanh"], "activation_alpha": [1.0]},
     "ScaledTanh without its activation_beta"),
    ({"activations": ["Tanh"], "activation_alpha": [0.5]}, "activation_alpha has 1 values"),
    ({"clip": -1.0}, "clip=-1.0"),
])
def test_refused_attributes_are_named(attrs, match):
    _refused("RNN", match, attrs)


def test_weights_computed_at_run_time_are_refused():
    values = layer_values("GRU")
    model, _ = layer_model("GRU", values, {}, runtime=("initial_h",))
    model.graph.input.append(helper.make_tensor_value_info("R2", onnx.TensorProto.FLOAT,
                                                           values["R"].shape))
    model.graph.node[0].input[2] = "R2"
    with pytest.raises(UnsupportedOperatorError, match="R .*must be a constant"):
        relay.frontend.from_onnx(model)


def test_sizes_past_the_bounds_are_refused():
    _refused("RNN", "hidden size 5000", hidden=5000, steps=1, batch=1, width=1)
    values = layer_values("RNN", steps=MAX_STEPS + 1, batch=1, width=1, hidden=1)
    model, _ = layer_model("RNN", values, {})
    with pytest.raises(UnsupportedOperatorError, match=f"{MAX_STEPS + 1} time steps"):
        relay.frontend.from_onnx(model)


def test_lengths_out_of_range():
    """A constant length past the steps is refused at import; one fed at run time stops the
    kernel with an error, never a read past the input."""
    values = layer_values("LSTM", lens=[2, 6, 1])
    model, _ = layer_model("LSTM", values, {})
    with pytest.raises(ModelError, match=r"sequence_lens \[2, 6, 1\] outside \[0, 5\]"):
        relay.frontend.from_onnx(model)
    model, feeds = layer_model("LSTM", values, {}, runtime=("sequence_lens",))
    with pytest.raises(KernelError, match="error code 3"):
        kernelrpc_outputs(model, feeds)


def crnn(steps_width=40, classes=37, hidden=24, seed=5):
    """A CRNN text recognizer as exporters write it: convolutions over a 16-pixel line image,
    the feature map's columns as the time steps (Transpose, Reshape), two bidirectional LSTMs
    with their directions joined again, a linear classifier and a softmax over the classes."""
    b = Builder(seed=seed, opset=14)

    def const(values):
        name = b.name("shape")
        b.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name
    x = b.op("Relu", [b.conv("image", 1, 8, 3)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Relu", [b.bn(b.conv(x, 8, 12, 3), 12)])
    x = b.op("MaxPool", [x], kernel_shape=[2, 1], strides=[2, 1])          # 12 x 4 x W/2
    steps = steps_width // 2
    x = b.op("Transpose", [x], perm=[3, 0, 1, 2])                            # W, N, C, H
    x = b.op("Reshape", [x, const([steps, 1, 48])])
    for width in (48, 2 * hidden):
        y = b.name("lstm")
        b.nodes.append(helper.make_node(
            "LSTM", [x, b.weight((2, 4 * hidden, width), scale=0.3),
                     b.weight((2, 4 * hidden, hidden), scale=0.3),
                     b.weight((2, 8 * hidden), scale=0.1)], [y], name=y,
            hidden_size=hidden, direction="bidirectional"))
        x = b.op("Transpose", [y], perm=[0, 2, 1, 3])                       # T, N, D, H
        x = b.op("Reshape", [x, const([steps, 1, 2 * hidden])])
    x = b.op("MatMul", [x, b.weight((2 * hidden, classes), scale=0.3)])
    logits = b.op("Add", [x, b.weight((classes,), scale=0.1)])
    return b.model({"image": [1, 1, 16, steps_width]}, [logits, b.op("Softmax", [logits], axis=2)])


def test_crnn_recognizer():
    logits, probs = run_model(crnn(), {"image": rand(RNG, 1, 1, 16, 40)}, tol=1e-4)
    assert logits.shape == probs.shape == (20, 1, 37)


@pytest.mark.cross
def test_crnn_recognizer_on_an_emulated_aarch64_board(tracker, tmp_path):  # noqa: F811
    model = crnn()
    feeds = {"image": rand(RNG, 1, 1, 16, 40)}
    expected = onnxruntime_outputs(model, feeds)[0]
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, "aarch64") as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        try:
            _, got = run_network(remote, lib, tmp_path / "crnn.so", feeds)
        except ToolchainError as exc:
            pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("batch,lens", [(5, [3, 1, 4, 0, 4]), (6, [4, 4, 2, 1, 3, 4]),
                                        (8, [1, 2, 3, 4, 4, 3, 2, 1])])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_batch_rows_in_groups(op, batch, lens):
    """Batch rows share each load of the recurrent weights in groups (5: one row at a time,
    6: groups of 3, 8: of 4), each row at its own time step in the reverse direction."""
    check_layer(op, steps=4, batch=batch, hidden=11, attrs={"direction": "bidirectional"},
                initial=True, lens=lens, runtime=("sequence_lens",))


NODE_CASES = [f"test_{op}_{form}" for op in ("lstm", "gru") for form in (
    "defaults", "with_initial_bias", "batchwise", "reverse", "bidirectional")] + [
    "test_lstm_with_peepholes", "test_gru_seq_length", "test_rnn_seq_length"] + [
    f"test_simple_rnn_{form}" for form in ("defaults", "with_initial_bias", "batchwise",
                                           "reverse", "bidirectional")]


@pytest.fixture(scope="module")
def node_cases():
    from onnx.backend.test.case.node import collect_testcases

    return {c.name: c for c in collect_testcases()}


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_node_cases(node_cases, name):
    """ONNX's own cases and expected outputs (its reference implementation, batch-first layout
    included), the weights made initializers. They are written at opset 22, whose versions of
    the three operators only added bfloat16 to version 14's types, and are imported as opset
    18 until the importer accepts newer versions."""
    case = node_cases[name]
    assert onnx.defs.get_schema(case.model.graph.node[0].op_type, 22).since_version == 22
    for inputs, expected in case.data_sets:
        model = onnx.ModelProto()
        model.CopyFrom(case.model)
        node = model.graph.node[0]
        weights = {node.input[k] for k in (1, 2, 3, 7) if k < len(node.input)} - {""}
        feeds = {}
        for info, value in zip(case.model.graph.input, inputs):
            if info.name in weights:
                model.graph.initializer.append(numpy_helper.from_array(value, info.name))
            else:
                feeds[info.name] = value
        kept = [i for i in model.graph.input if i.name not in weights]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.opset_import[0].version = 18
        got = kernelrpc_outputs(model, feeds)
        assert len(got) == len(expected)
        for out, ref in zip(got, expected):
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
