"""The comparison and logic operators (Equal, Less, LessOrEqual, Greater, GreaterOrEqual,
Not, And, Or, Xor, Where, IsNaN, IsInf) against onnxruntime, in every opset from the one
that introduced each form to the newest the installed onnx knows; broadcasting of odd shapes,
float and integer operands, bool results used as the graph's outputs."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from onnx_check import NEWEST_OPSET, check_graph  # noqa: E402

RNG = np.random.default_rng(11)
COMPARISONS = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]


def _operands(dtype):
    a = RNG.integers(-3, 4, (2, 3, 5)).astype(dtype)
    b = RNG.integers(-3, 4, (3, 1)).astype(dtype)
    return a, b


@pytest.mark.parametrize("opset", [12, 16, NEWEST_OPSET])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons_broadcast(opset, dtype):
    """Few distinct values, so that equal pairs are common; LessOrEqual and GreaterOrEqual
    exist from opset 12."""
    a, b = _operands(dtype)
    nodes = [helper.make_node(op, ["a", "b"], [op.lower()]) for op in COMPARISONS]
    check_graph(nodes, {"a": a, "b": b}, [op.lower() for op in COMPARISONS], opset=opset)


@pytest.mark.parametrize("opset", [9, 11])
def test_equal_less_greater_of_the_first_opsets(opset):
    a, b = _operands(np.int32 if opset < 11 else np.float32)
    nodes = [helper.make_node(op, ["a", "b"], [op.lower()]) for op in ("Equal", "Less", "Greater")]
    check_graph(nodes, {"a": a, "b": b}, ["equal", "less", "greater"], opset=opset)


@pytest.mark.parametrize("opset", [9, NEWEST_OPSET])
def test_logic_and_where(opset):
    """And, Or, Xor, Not of broadcast masks, and Where choosing between float tensors."""
    a, b = _operands(np.float32)
    nodes = [helper.make_node("Less", ["a", "b"], ["p"]),
             helper.make_node("Greater", ["b", "zero"], ["q"]),
             helper.make_node("And", ["p", "q"], ["and"]),
             helper.make_node("Or", ["p", "q"], ["or"]),
             helper.make_node("Xor", ["p", "q"], ["xor"]),
             helper.make_node("Not", ["p"], ["not"]),
             helper.make_node("Where", ["xor", "a", "b"], ["where"])]
    check_graph(nodes, {"a": a, "b": b}, ["and", "or", "xor", "not", "where"],
          inits={"zero": np.zeros((), np.float32)}, opset=opset)


@pytest.mark.parametrize("opset", [10, 20, NEWEST_OPSET])
@pytest.mark.parametrize("attrs", [{}, dict(detect_negative=0), dict(detect_positive=0)])
def test_isnan_isinf(opset, attrs):
    x = np.asarray(RNG.standard_normal((3, 7)), np.float32)
    x[0, 1], x[1, 2], x[2, 3], x[2, 6] = np.nan, np.inf, -np.inf, np.nan
    nodes = [helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("IsInf", ["x"], ["inf"], **attrs)]
    check_graph(nodes, {"x": x}, ["nan", "inf"], opset=opset)


def test_where_with_a_scalar_choice_and_computed_mask():
    """A causal mask's form: Where(mask, scores, -inf-like constant)."""
    x = np.asarray(RNG.standard_normal((2, 5, 5)), np.float32)
    mask = np.tril(np.ones((5, 5), bool))
    check_graph([helper.make_node("Where", ["mask", "x", "low"], ["y"])], {"x": x},
          inits={"mask": mask, "low": np.asarray(-1e4, np.float32)})
