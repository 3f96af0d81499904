"""The normalizations of frontend/onnx_norm.py against onnxruntime: LayerNormalization as torch
exports it (opset 17, last axis) and over several axes, InstanceNormalization,
GroupNormalization (opset 18's per-group and 21's per-channel scale), LpNormalization; rows of
32 elements or more (their sums in partial lanes, relay/op/rows.py) whose last vector is
short, over one axis and several."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_check import check, one_node_model, opsets, rand  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay.errors import UnsupportedOperatorError  # noqa: E402

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("opset", opsets("LayerNormalization"))
@pytest.mark.parametrize("shape,axis,scale_shape,bias", [
    ((2, 7, 33), None, (33,), True),          # torch's export: the last axis, scale and bias
    ((1, 5, 12), -1, (12,), False),
    ((2, 3, 4, 5), 1, (3, 4, 5), True),
    ((2, 3, 4, 5), -2, (1, 5), True),         # scale broadcast within the normalized shape
    ((3, 9), 0, (3, 9), True),
])
def test_layer_norm(shape, axis, scale_shape, bias, opset):
    x = rand(RNG, *shape) * np.float32(4) + np.float32(10)      # a large mean
    attrs = {} if axis is None else {"axis": axis}
    inits = {"scale": rand(RNG, *scale_shape)}
    if bias:
        inits["bias"] = rand(RNG, *scale_shape)
    check("LayerNormalization", {"x": x}, attrs, inits, opset=opset)


def test_layer_norm_epsilon():
    x = rand(RNG, 2, 3, 5) * np.float32(1e-2)
    check("LayerNormalization", {"x": x}, {"epsilon": 1e-2},
          {"scale": rand(RNG, 5), "bias": rand(RNG, 5)}, opset=17)


@pytest.mark.parametrize("opset", opsets("InstanceNormalization"))
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 4, 9), (2, 2, 3, 3, 3), (1, 3, 10, 11)])
def test_instance_norm(shape, opset):
    c = shape[1]
    check("InstanceNormalization", {"x": rand(RNG, *shape) + np.float32(2)},
          {"epsilon": 1e-4} if len(shape) == 3 else {}, {"s": rand(RNG, c), "b": rand(RNG, c)},
          opset=opset)


@pytest.mark.parametrize("opset", opsets("GroupNormalization"))
@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 3), 3), ((1, 8, 7), 2), ((2, 4, 3, 3), 4),
                                          ((1, 5, 3, 2), 1), ((1, 8, 6, 7), 2)])
def test_group_norm(shape, groups, opset):
    size = shape[1] if opset >= 21 else groups
    check("GroupNormalization", {"x": rand(RNG, *shape) * np.float32(3)},
          {"num_groups": groups, "epsilon": 1e-3},
          {"s": rand(RNG, size), "b": rand(RNG, size)}, opset=opset)


@pytest.mark.parametrize("opset", opsets("LpNormalization"))
@pytest.mark.parametrize("attrs", [{}, {"p": 1}, {"axis": 0, "p": 2}, {"axis": 1, "p": 1}])
def test_lp_norm(attrs, opset):
    x = rand(RNG, 3, 4, 5)
    x[1, :, 2] = 0          # a zero row along axis 1
    x[:, 3, 4] = 0
    check("LpNormalization", {"x": x}, attrs, opset=opset)


@pytest.mark.parametrize("op,inputs,attrs,inits,opset,reason", [
    ("LpNormalization", {"x": np.ones((2, 3), np.float32)}, {"p": 3}, {}, 13, "p=3"),
    ("LayerNormalization", {"x": np.ones((2, 3), np.float32)}, {"stash_type": 0},
     {"s": np.ones(3, np.float32)}, 17, "stash_type=0"),
    ("LayerNormalization", {"x": np.ones((2, 3), np.float64)}, {},
     {"s": np.ones(3, np.float64)}, 17, "LayerNormalization of float64"),
    ("InstanceNormalization", {"x": np.ones((1, 2, 3), np.float64)}, {},
     {"s": np.ones(2, np.float64), "b": np.ones(2, np.float64)}, 13, "of float64"),
])
def test_refused_forms_are_named(op, inputs, attrs, inits, opset, reason):
    model = one_node_model(op, inputs, attrs, inits, opset=opset)
    with pytest.raises(UnsupportedOperatorError, match=reason):
        relay.frontend.from_onnx(model)
