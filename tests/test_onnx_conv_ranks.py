"""Convolutions and poolings of 1 and 3 spatial dimensions against onnxruntime: Conv,
ConvTranspose, MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool of [N, C, L] and
[N, C, D, H, W] inputs (the 2-D operators underneath: 1-D over a unit height, 3-D with the
depth folded into a 2-D convolution's channels or pooled after the planes), with odd sizes and
every attribute form; the 2-D strategies on unit-height maps."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_check import (  # noqa: E402
    N,
    check,
    compare,
    graph_model,
    one_node_model,
    opsets,
    rand,
    run,
    run_model,
)
from test_relay_conv_channels import Knobs  # noqa: E402
from test_relay_emulated import board_session, run_checked, tracker  # noqa: E402,F401

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import strategy  # noqa: E402
from kernelrpc.relay.errors import UnsupportedOperatorError  # noqa: E402
from kernelrpc.relay.frontend.onnx_nn import MAX_UNFOLDED_BYTES  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(41)

#: (input shape, weight shape, attributes): 1-D convolutions
CONV_1D = {
    "strided dilated": ((2, 6, 37), (4, 6, 5), {"strides": [2], "dilations": [2],
                                                "pads": [1, 3]}),
    "grouped": ((1, 6, 37), (9, 2, 5), {"group": 3, "pads": [2, 0]}),
    "depthwise": ((1, 8, 41), (8, 1, 7), {"group": 8, "strides": [3], "pads": [3, 3]}),
    "depthwise x2": ((1, 4, 29), (8, 1, 3), {"group": 4, "dilations": [3]}),
    "pointwise": ((1, 16, 23), (24, 16, 1), {}),
    "same upper": ((1, 5, 37), (7, 5, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    "same lower": ((1, 5, 36), (7, 5, 4), {"auto_pad": "SAME_LOWER", "strides": [3]}),
    "valid": ((1, 3, 37), (5, 3, 6), {"auto_pad": "VALID", "strides": [4]}),
    "kernel_shape": ((1, 3, 17), (4, 3, 3), {"kernel_shape": [3], "pads": [0, 2]}),
}

#: 3-D convolutions
CONV_3D = {
    "strided dilated": ((1, 4, 7, 9, 8), (6, 4, 3, 3, 2), {"strides": [2, 1, 2],
                                                          "dilations": [2, 1, 1],
                                                          "pads": [1, 0, 2, 2, 1, 0]}),
    "grouped": ((2, 6, 5, 6, 7), (4, 3, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 0, 1, 1]}),
    "depthwise": ((1, 4, 6, 7, 5), (4, 1, 3, 3, 3), {"group": 4, "strides": [1, 2, 1],
                                                     "pads": [1, 1, 1, 1, 1, 1]}),
    "depth 1": ((1, 3, 5, 8, 8), (8, 3, 1, 3, 3), {"pads": [0, 1, 1, 0, 1, 1]}),
    "same lower": ((1, 2, 9, 5, 6), (3, 2, 3, 2, 3), {"auto_pad": "SAME_LOWER",
                                                      "strides": [2, 2, 1]}),
    "same upper": ((1, 2, 8, 5, 6), (3, 2, 4, 2, 3), {"auto_pad": "SAME_UPPER",
                                                      "strides": [3, 1, 2]}),
    "valid": ((1, 3, 6, 6, 6), (2, 3, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2, 2]}),
}

#: (input shape, weight shape, attributes): transposed convolutions
CONV_TRANSPOSE = {
    "1-D strided": ((1, 4, 13), (4, 3, 5), {"strides": [3], "pads": [1, 2],
                                            "output_padding": [1]}),
    "1-D grouped dilated": ((2, 6, 11), (6, 2, 3), {"group": 3, "strides": [2],
                                                    "dilations": [2]}),
    "1-D output_shape": ((1, 3, 10), (3, 2, 4), {"strides": [2], "output_shape": [23]}),
    "1-D same upper": ((1, 3, 10), (3, 2, 3), {"strides": [2], "auto_pad": "SAME_UPPER"}),
    "1-D same lower": ((1, 3, 10), (3, 2, 4), {"strides": [3], "auto_pad": "SAME_LOWER"}),
    "1-D valid": ((1, 3, 7), (3, 5, 3), {"auto_pad": "VALID"}),
    "3-D strided": ((1, 3, 4, 5, 6), (3, 2, 3, 2, 3), {"strides": [2, 1, 3],
                                                       "pads": [1, 0, 2, 0, 1, 1],
                                                       "output_padding": [1, 0, 2]}),
    "3-D grouped dilated": ((1, 4, 3, 4, 5), (4, 3, 2, 3, 2), {"group": 2, "strides": [3, 2, 1],
                                                               "dilations": [2, 1, 2]}),
    "3-D output_shape": ((1, 2, 3, 4, 4), (2, 2, 3, 3, 3), {"strides": [2, 2, 2],
                                                            "output_shape": [8, 9, 10]}),
    "3-D same lower": ((1, 2, 3, 4, 4), (2, 3, 2, 3, 2), {"strides": [2, 1, 2],
                                                          "auto_pad": "SAME_LOWER"}),
}


def _conv(op, x_shape, w_shape, attrs, opset, bias=True):
    out_channels = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    inits = {"w": rand(RNG, *w_shape)}
    if bias:
        inits["b"] = rand(RNG, out_channels)
    return check(op, {"x": rand(RNG, *x_shape)}, attrs, inits, opset=opset)


@pytest.mark.parametrize("case", CONV_1D)
def test_conv_1d(case):
    _conv("Conv", *CONV_1D[case], opset=11)


@pytest.mark.parametrize("case", CONV_3D)
def test_conv_3d(case):
    _conv("Conv", *CONV_3D[case], opset=11)


@pytest.mark.parametrize("case", CONV_TRANSPOSE)
def test_conv_transpose(case):
    _conv("ConvTranspose", *CONV_TRANSPOSE[case], opset=11, bias=case.startswith("1-D"))


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("rank", [1, 3])
def test_every_opset(op, rank):
    cases = CONV_1D if op == "Conv" and rank == 1 else CONV_3D if op == "Conv" else \
        {k: v for k, v in CONV_TRANSPOSE.items() if k.startswith(f"{rank}-D")}
    x_shape, w_shape, attrs = next(iter(cases.values()))
    for opset in opsets(op):
        _conv(op, x_shape, w_shape, attrs, opset)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("rank", [1, 3])
def test_weight_computed_at_run_time(op, rank):
    """A weight that is an input of the graph: reshaped (and for ConvTranspose reversed) by
    the kernels, not at import."""
    spatial = (19,) if rank == 1 else (4, 5, 6)
    x, w = rand(RNG, 1, 4, *spatial), rand(RNG, 4, 2, *(3,) * rank)
    check(op, {"x": x, "w": w}, {"group": 2, "strides": [2] * rank, "pads": [1] * (2 * rank)})


#: (input shape, attributes, smallest opset): poolings of 1 and 3 spatial dimensions
POOLS = {
    "1-D": ((2, 3, 37), {"kernel_shape": [5], "strides": [2], "pads": [2, 1]}, 9),
    "1-D ceil": ((1, 4, 36), {"kernel_shape": [4], "strides": [3], "pads": [1, 2],
                              "ceil_mode": 1}, 10),
    "1-D same upper": ((1, 2, 37), {"kernel_shape": [4], "strides": [3],
                                    "auto_pad": "SAME_UPPER"}, 9),
    "1-D same lower": ((1, 2, 37), {"kernel_shape": [4], "strides": [2],
                                    "auto_pad": "SAME_LOWER"}, 9),
    "1-D valid": ((1, 2, 37), {"kernel_shape": [6], "strides": [5], "auto_pad": "VALID"}, 9),
    "3-D": ((1, 3, 7, 9, 8), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2],
                              "pads": [1, 0, 1, 1, 1, 0]}, 9),
    "3-D ceil": ((2, 2, 8, 7, 9), {"kernel_shape": [3, 3, 2], "strides": [2, 3, 2],
                                   "pads": [0, 1, 1, 1, 0, 1], "ceil_mode": 1}, 10),
    "3-D same upper": ((1, 2, 7, 6, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1],
                                         "auto_pad": "SAME_UPPER"}, 9),
    "3-D valid": ((1, 2, 7, 6, 5), {"kernel_shape": [3, 2, 2], "strides": [3, 1, 2],
                                    "auto_pad": "VALID"}, 9),
}
#: dilated windows
DILATED_POOLS = {
    "1-D ceil": ((1, 3, 37), {"kernel_shape": [3], "strides": [2], "pads": [2, 1],
                              "dilations": [2], "ceil_mode": 1}),
    "2-D": ((1, 2, 11, 13), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [2, 1, 1, 1],
                             "dilations": [2, 3], "ceil_mode": 1}),
    "3-D": ((1, 2, 9, 8, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2],
                              "pads": [1, 1, 0, 0, 2, 1], "dilations": [3, 2, 1]}),
}


def _newest(op):
    return opsets(op)[-1]


@pytest.mark.parametrize("case", POOLS)
def test_max_pool(case):
    """At the case's first opset or the newest, in turn."""
    shape, attrs, since = POOLS[case]
    opset = max(since, 10) if list(POOLS).index(case) % 2 else _newest("MaxPool")
    check("MaxPool", {"x": rand(RNG, *shape)}, attrs, opset=opset)


@pytest.mark.parametrize("case", POOLS)
def test_average_pool(case):
    """``count_include_pad=0`` at the case's first opset, 1 at the newest."""
    shape, attrs, since = POOLS[case]
    for include, opset in ((0, since), (1, _newest("AveragePool"))):
        check("AveragePool", {"x": rand(RNG, *shape)}, {**attrs, "count_include_pad": include},
              opset=opset)


@pytest.mark.parametrize("case", DILATED_POOLS)
def test_dilated_pool(case):
    """MaxPool from opset 10, AveragePool (both ``count_include_pad``) from 19."""
    shape, attrs = DILATED_POOLS[case]
    x = {"x": rand(RNG, *shape)}
    check("MaxPool", x, attrs, opset=10)
    check("AveragePool", x, {**attrs, "count_include_pad": 0}, opset=19)
    check("AveragePool", x, {**attrs, "count_include_pad": 1}, opset=_newest("AveragePool"))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 5, 37), (1, 3, 5, 6, 7)], ids=str)
def test_global_pool(op, shape):
    check(op, {"x": rand(RNG, *shape)}, opset=_newest(op))


def _audio_network():
    """A 1-D convolutional network the way torch exports one: Conv1d + BatchNorm + Relu,
    MaxPool1d, a depthwise and a pointwise Conv1d, global average pooling, a classifier."""
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], strides=[2], pads=[3, 3]),
             N("BatchNormalization", ["c1", "s", "o", "m", "v"], ["n1"]),
             N("Relu", ["n1"], ["r1"]),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[3], strides=[2], pads=[1, 1]),
             N("Conv", ["p1", "w2"], ["c2"], group=8, pads=[2, 2]),
             N("Conv", ["c2", "w3", "b3"], ["c3"]),
             N("Relu", ["c3"], ["r3"]),
             N("GlobalAveragePool", ["r3"], ["g"]),
             N("Flatten", ["g"], ["f"]),
             N("Gemm", ["f", "wc", "bc"], ["y"], transB=1)]
    inits = {"w1": rand(RNG, 8, 1, 7), "b1": rand(RNG, 8), "s": rand(RNG, 8, positive=True),
             "o": rand(RNG, 8), "m": rand(RNG, 8), "v": rand(RNG, 8, positive=True),
             "w2": rand(RNG, 8, 1, 5), "w3": rand(RNG, 12, 8, 1), "b3": rand(RNG, 12),
             "wc": rand(RNG, 5, 12), "bc": rand(RNG, 5)}
    inputs = {"x": rand(RNG, 1, 1, 577)}
    return graph_model(nodes, inputs, ["y"], inits, opset=13), inputs


def test_audio_network():
    run_model(*_audio_network())


@pytest.mark.cross
def test_audio_network_on_an_emulated_aarch64_board(tracker, tmp_path):  # noqa: F811
    model, inputs = _audio_network()
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, "aarch64") as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        run_checked(remote, lib, tmp_path / "audio.so", inputs,
                    onnxruntime_outputs(model, inputs)[0], "aarch64")


def _built_kernels(model, inputs):
    """The kinds of the kernels ``model`` runs as, its outputs checked against onnxruntime."""
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    compare(run(module, inputs), onnxruntime_outputs(model, inputs))
    return [kernel["kind"] for kernel in lib.executor["kernels"]]


def test_a_conv1d_batch_norm_relu_stack_fuses_as_in_2d():
    """Conv1d + BatchNorm + Relu three times, a residual Add in the last, then global average
    pooling and a classifier: the unit-height reshapes between the layers cancel, each batch
    normalization folds into its convolution's weights and bias, each layer is one kernel with
    its bias, residual and activation, the pooling reads the last layer's map (as in a 2-D
    network); the input's reshape, the last map's (an output of the network too) and the
    pooled vector's flattening remain."""
    nodes, inits, prev = [], {}, "x"
    for k, (cin, cout) in enumerate([(3, 8), (8, 8), (8, 8)]):
        bias = [f"b{k}"] if k != 1 else []                     # a bias-less one too
        nodes += [N("Conv", [prev, f"w{k}", *bias], [f"c{k}"], pads=[2, 2]),
                  N("BatchNormalization", [f"c{k}", f"s{k}", f"o{k}", f"m{k}", f"v{k}"],
                    [f"n{k}"])]
        if k == 2:
            nodes.append(N("Add", ["n2", "r1"], ["n2r"]))
        nodes.append(N("Relu", [f"n{k}r" if k == 2 else f"n{k}"], [f"r{k}"]))
        inits.update({f"w{k}": rand(RNG, cout, cin, 5), f"b{k}": rand(RNG, cout),
                      f"s{k}": rand(RNG, cout, positive=True), f"o{k}": rand(RNG, cout),
                      f"m{k}": rand(RNG, cout), f"v{k}": rand(RNG, cout, positive=True)})
        prev = f"r{k}"
    nodes += [N("GlobalAveragePool", ["r2"], ["g"]), N("Flatten", ["g"], ["f"]),
              N("Gemm", ["f", "wc", "bc"], ["y"], transB=1)]
    inits.update({"wc": rand(RNG, 4, 8), "bc": rand(RNG, 4)})
    inputs = {"x": rand(RNG, 2, 3, 53)}
    kinds = _built_kernels(graph_model(nodes, inputs, ["r2", "y"], inits), inputs)
    assert kinds == ["fused_reshape", "fused_nn_conv2d_add_relu", "fused_nn_conv2d_add_relu",
                     "fused_nn_conv2d_add_add_relu", "fused_reshape", "fused_nn_global_pool",
                     "fused_reshape", "fused_nn_dense_add"]


def test_elementwise_operators_cross_unit_reshapes():
    """Unsqueeze, Mul, Add and Where (constants broadcast from either side of the reshape),
    Squeeze, Relu, and a Sigmoid of the unsqueezed input too: the Unsqueeze and Squeeze
    cancel, the Sigmoid runs before its reshape, computed as onnxruntime does."""
    nodes = [N("Unsqueeze", ["x", "ax"], ["u"]),                         # [2, 3, 1, 5, 1]
             N("Mul", ["u", "per_channel"], ["m"]),
             N("Add", ["m", "scalar"], ["a"]),
             N("Where", ["mask", "a", "full"], ["w"]),
             N("Squeeze", ["w", "ax"], ["s"]),                           # [2, 3, 5]
             N("Relu", ["s"], ["y"]),
             N("Sigmoid", ["u"], ["z"])]
    inits = {"ax": np.array([2, 4], np.int64), "per_channel": rand(RNG, 3, 1, 1, 1),
             "scalar": np.asarray(0.25, np.float32), "mask": RNG.random((5, 1)) > 0.5,
             "full": rand(RNG, 2, 3, 1, 5, 1)}
    inputs = {"x": rand(RNG, 2, 3, 5)}
    kinds = _built_kernels(graph_model(nodes, inputs, ["y", "z"], inits), inputs)
    assert kinds == ["fused_multiply_add_where_relu", "fused_sigmoid_reshape"]


def _conv2d_nodes(model):
    mod, _ = relay.frontend.from_onnx(model)
    return [n for n in mod["main"].topo() if n.op == "nn.conv2d"]


def test_unit_height_strategies():
    """A 1-D convolution is a 2-D one of unit height, 1 x K kernel: the depthwise strategy
    tiles one row, the columns and channels layouts are offered as on a 2-D map, and each
    computes the convolution."""
    tiles = strategy.tiles_for(Target(None))
    # 63 columns: channels tiles of rows of 7 or 9 fit 16 registers as well as 32
    x, w = rand(RNG, 1, 16, 63), rand(RNG, 2 * tiles.lanes, 16, 5)
    model = one_node_model("Conv", {"x": x}, {"pads": [2, 2]}, {"w": w})
    (conv,) = _conv2d_nodes(model)
    assert conv.shape[2] == 1 and conv.inputs[1].shape[2:] == (1, 5)
    assert {s.name for s in strategy.candidates(tiles, conv)} == {"columns", "channels"}
    mod, params = relay.frontend.from_onnx(model)
    expect = onnxruntime_outputs(model, {"x": x})
    for layout in ("columns", "channels"):
        with Knobs(layout=layout):
            lib = relay.build(mod, target="llvm", params=params)
        assert [k["config"]["layout"] for k in lib.executor["kernels"] if "config" in k] == \
            [layout]
        module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
        compare(run(module, {"x": x}), expect)
    depthwise = one_node_model("Conv", {"x": x}, {"group": 16, "pads": [2, 2]},
                               {"w": rand(RNG, 16, 1, 5)})
    (conv,) = _conv2d_nodes(depthwise)
    assert [s.name for s in strategy.candidates(tiles, conv)] == ["depthwise"]
    assert strategy.depthwise_tile(tiles, conv)[0] == 1


@pytest.mark.parametrize("op,inputs,attrs,inits,reason", [
    ("Conv", {"x": ((1, 2, 3, 4, 5, 6), "float32")}, {}, {"w": np.ones((2, 2, 1, 1, 1, 1),
                                                                       np.float32)},
     r"Conv of a 6-D input \[1, 2, 3, 4, 5, 6\] \(1-D, 2-D and 3-D are implemented"),
    ("MaxPool", {"x": ((1, 2, 3, 4, 5, 6), "float32")}, {"kernel_shape": [1, 1, 1, 1]}, {},
     "MaxPool of a 6-D input"),
    ("Conv", {"x": ((1, 64, 512, 256, 256), "float32")}, {"pads": [1] * 6},
     {"w": np.ones((4, 64, 3, 1, 1), np.float32)},
     f"would unfold its input to .* bytes \\(at most {MAX_UNFOLDED_BYTES}\\)"),
    ("MaxPool", {"x": ((1, 2, 9), "float32")}, {"kernel_shape": [3], "storage_order": 1}, {},
     "storage_order=1 is not implemented"),
])
def test_refused_forms_are_named(op, inputs, attrs, inits, reason):
    model = one_node_model(op, inputs, attrs, inits, opset=13)
    with pytest.raises(UnsupportedOperatorError, match=reason):
        relay.frontend.from_onnx(model)


@pytest.mark.parametrize("shape,attrs", [
    ((1, 3, 11, 9), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": 3}),
    ((2, 4, 17), {"kernel_shape": [4], "strides": [3], "p": 1}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "auto_pad": "SAME_UPPER"}),
])
def test_lp_pool(shape, attrs):
    check("LpPool", {"x": rand(RNG, *shape)}, attrs, opset=18, tol=1e-4)


def test_global_lp_pool():
    check("GlobalLpPool", {"x": rand(RNG, 2, 3, 5, 7)}, {"p": 3}, opset=13, tol=1e-4)


def test_lp_pool_in_ceil_mode_is_refused():
    with pytest.raises(UnsupportedOperatorError, match="ceil_mode=1"):
        check("LpPool", {"x": rand(RNG, 1, 2, 6, 6)}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                       "ceil_mode": 1}, opset=18)
