"""The activations and elementwise math of frontend/onnx_activation.py, compiled and run against
onnxruntime at every opset where the operator's definition changes (9 to the newest), odd
shapes, every attribute form; the forms kernelrpc refuses are refused by name."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_check import check, kernelrpc_outputs, one_node_model, opsets, rand  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay.errors import UnsupportedOperatorError  # noqa: E402

RNG = np.random.default_rng(11)


def _x(*shape, scale=3.0):
    return rand(RNG, *shape) * np.float32(scale)


UNARY = [("Erf", {}), ("Softplus", {}), ("Softsign", {}), ("Mish", {}), ("Elu", {}),
         ("Elu", {"alpha": 0.3}), ("Selu", {}), ("Selu", {"alpha": 1.2, "gamma": 0.8}),
         ("Celu", {}), ("Celu", {"alpha": 0.6}), ("ThresholdedRelu", {}),
         ("ThresholdedRelu", {"alpha": -0.25}), ("Sign", {}), ("Sin", {}), ("Cos", {})]


@pytest.mark.parametrize("op,attrs,opset", [(op, attrs, opset) for op, attrs in UNARY
                                             for opset in opsets(op)], ids=str)
def test_unary(op, attrs, opset):
    check(op, {"x": _x(2, 3, 7)}, attrs, opset=opset)


def test_softplus_and_mish_do_not_overflow():
    x = np.asarray([[-120.0, -30.0, -1.0, 0.0, 1.0, 30.0, 120.0]], np.float32)
    check("Softplus", {"x": x}, opset=13)
    check("Mish", {"x": x}, opset=18)


def test_sign_of_integers_and_zero():
    check("Sign", {"x": np.asarray([-5, 0, 3, -1], np.int32)}, opset=13)
    check("Sign", {"x": np.asarray([-0.5, 0.0, 2.0], np.float32)}, opset=9)


@pytest.mark.parametrize("opset", opsets("Round"))
def test_round_halves_to_even(opset):
    x = np.asarray([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.49, -3.51]], np.float32)
    check("Round", {"x": np.concatenate([x, _x(1, 8)])}, opset=opset)


@pytest.mark.parametrize("opset", opsets("Gelu"))
@pytest.mark.parametrize("approximate", [None, "none", "tanh"])
def test_gelu(approximate, opset):
    attrs = {} if approximate is None else {"approximate": approximate}
    check("Gelu", {"x": _x(3, 5, 9)}, attrs, opset=opset)


@pytest.mark.parametrize("opset", opsets("Mod"))
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_integers(dtype, fmod, opset):
    info = np.iinfo(dtype)
    a = RNG.integers(max(info.min, -50), 50, (3, 7)).astype(dtype)
    b = RNG.integers(1, 9, (7,)).astype(dtype)
    if info.min < 0:
        b = b * np.where(RNG.random(7) < 0.5, -1, 1).astype(dtype)
    check("Mod", {"a": a, "b": b}, {"fmod": fmod}, opset=opset)


def test_mod_of_floats_broadcast():
    check("Mod", {"a": _x(2, 3, 5, scale=10), "b": rand(RNG, 3, 1, positive=True)},
          {"fmod": 1}, opset=13)


def test_floored_mod_of_floats_from_opset_28():
    """``fmod=0`` of floats (opset 28) is numpy's ``mod``: zeros take the divisor's sign,
    infinities and zero divisors as the standard says."""
    values = np.asarray([0.0, -0.0, 5.5, -5.5, 3.0, np.inf, -np.inf, np.nan], np.float32)
    a = np.repeat(values, len(values)).reshape(len(values), -1)
    b = np.tile(np.asarray([3.0, -3.0, 0.0, -0.0, 2.5, np.inf, -np.inf, np.nan], np.float32),
                (len(values), 1))
    inputs = {"a": a, "b": b}
    got, = kernelrpc_outputs(one_node_model("Mod", inputs, opset=28), inputs)
    with np.errstate(all="ignore"):
        expect = np.mod(a, b)
    np.testing.assert_array_equal(got, expect)
    zeros = expect == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(expect[zeros]))


def test_integer_mod_by_zero_is_zero_not_a_trap():
    inputs = {"a": np.arange(-3, 3, dtype=np.int32),
              "b": np.asarray([2, 0, 3, 0, -2, 1], np.int32)}
    got, = kernelrpc_outputs(one_node_model("Mod", inputs, opset=13), inputs)
    np.testing.assert_array_equal(got, [1, 0, 2, 0, -1, 0])


@pytest.mark.parametrize("opset", opsets("Hardmax"))
@pytest.mark.parametrize("shape,axis", [((3, 7), None), ((2, 3, 5), 1), ((2, 3, 5), 0),
                                        ((2, 3, 5), -1)])
def test_hardmax(shape, axis, opset):
    x = np.round(_x(*shape))             # ties: the first index wins
    attrs = {} if axis is None else {"axis": axis}
    check("Hardmax", {"x": x}, attrs, opset=opset)


@pytest.mark.parametrize("op,inputs,attrs,reason", [
    ("Erf", {"x": np.ones((2, 3), np.float64)}, {}, "Erf of float64 is not implemented"),
    ("Sin", {"x": np.ones((2, 3), np.int32)}, {}, "Sin of int32 is not implemented"),
    ("Gelu", {"x": np.ones(3, np.float32)}, {"approximate": "fast"}, "approximate='fast'"),
    ("Celu", {"x": np.ones(3, np.float32)}, {"alpha": 0.0}, "alpha=0"),
    ("Mod", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float32)}, {},
     "Mod of floats needs fmod=1"),
    ("Hardmax", {"x": np.ones((2, 3), np.int32)}, {}, "Hardmax of int32"),
])
def test_refused_forms_are_named(op, inputs, attrs, reason):
    opset = 20 if op == "Gelu" else 13
    model = one_node_model(op, inputs, attrs, opset=opset)
    with pytest.raises(UnsupportedOperatorError, match=reason):
        try:
            relay.frontend.from_onnx(model)
        except UnsupportedOperatorError as exc:
            if "newer than opset" in str(exc):
                pytest.skip(f"the importer refuses opset {opset}")
            raise
