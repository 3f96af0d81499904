"""The reductions and selections of frontend/onnx_reduce.py against onnxruntime: ReduceSum,
Mean, Max, Min, L1, L2, LogSum, LogSumExp, Prod, SumSquare (axes as an attribute, and as an
input from opset 18, 13 for ReduceSum, with ``noop_with_empty_axes``), ArgMax and ArgMin, TopK,
CumSum and Einsum in the forms transformers use."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx_check import check, one_node_model, opsets, rand  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay.errors import UnsupportedOperatorError  # noqa: E402
from kernelrpc.relay.frontend.onnx_reduce import MAX_SCAN_AXIS, parse_einsum  # noqa: E402

RNG = np.random.default_rng(3)
BASIC = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]
REDUCTIONS = ["ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd",
              "ReduceSumSquare"]
#: (axes, keepdims): every axes form with both keepdims values among them
AXES = [(None, None), ([1], 0), ([0, -1], None), ([-2], 0), ([2, 0, 1], 0)]


def _reduce_input(op):
    if op == "ReduceProd":
        return rand(RNG, 3, 4, 5, positive=True) * np.float32(0.8)
    if op in ("ReduceLogSum", "ReduceSum", "ReduceMean"):
        return rand(RNG, 3, 4, 5, positive=True)         # no cancellation: tolerance of scale
    if op == "ReduceLogSumExp":
        return rand(RNG, 3, 4, 5) * np.float32(40)           # exp overflows without the shift
    return rand(RNG, 3, 4, 5)


def _axes_input_since(op):
    return 13 if op == "ReduceSum" else 18


def _check_reduction(op, opset, axes, attrs):
    inits = {}
    if axes is not None:
        if opset >= _axes_input_since(op):
            inits["axes"] = np.asarray(axes, np.int64)
        else:
            attrs["axes"] = axes
    check(op, {"x": _reduce_input(op)}, attrs, inits, opset=opset)


@pytest.mark.parametrize("op,opset", [(op, opset) for op in REDUCTIONS for opset in opsets(op)],
                         ids=str)
@pytest.mark.parametrize("axes,keepdims", AXES, ids=str)
def test_reduction(op, opset, axes, keepdims):
    _check_reduction(op, opset, axes, {} if keepdims is None else {"keepdims": keepdims})


@pytest.mark.parametrize("op,opset", [(op, opset) for op in BASIC for opset in opsets(op)],
                         ids=str)
@pytest.mark.parametrize("axes,keepdims", [(None, None), ([0, -1], 0)], ids=str)
def test_sum_mean_max_min(op, opset, axes, keepdims):
    _check_reduction(op, opset, axes, {} if keepdims is None else {"keepdims": keepdims})


@pytest.mark.parametrize("op", BASIC + REDUCTIONS)
@pytest.mark.parametrize("axes,noop", [(None, 1), ([], 1), ([1, -1], 0), ([1, -1], 1),
                                       (None, 0)], ids=str)
def test_noop_with_empty_axes(op, axes, noop):
    """Without axes, ``noop_with_empty_axes=1`` leaves the input (through the elementwise
    steps); with axes it has no effect (torch's exporter writes ``0`` beside every axes)."""
    inits = {} if axes is None else {"axes": np.asarray(axes, np.int64)}
    check(op, {"x": _reduce_input(op)}, {"noop_with_empty_axes": noop}, inits,
          opset=_axes_input_since(op))


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_max_min_of_bool(op):
    """Opset 20's only change: bool inputs (False < True)."""
    x = RNG.random((3, 4)) < 0.3
    check(op, {"x": x}, {"keepdims": 0}, {"axes": np.asarray([1], np.int64)}, opset=20)


@pytest.mark.parametrize("op", ["ReduceL1", "ReduceSumSquare", "ReduceProd"])
def test_integer_reductions(op):
    x = RNG.integers(-4, 5, (3, 5)).astype(np.int64)
    check(op, {"x": x}, {"axes": [1]}, opset=13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1}, {"axis": -1, "keepdims": 0},
                                   {"axis": 0, "select_last_index": 1},
                                   {"axis": 2, "keepdims": 0, "select_last_index": 1}], ids=str)
def test_argmax_argmin(op, attrs):
    x = np.round(rand(RNG, 3, 5, 7))           # ties everywhere: first or last index
    for opset in opsets(op):
        if opset < 12 and "select_last_index" in attrs:
            continue
        check(op, {"x": x}, attrs, opset=opset)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_argmax_argmin_of_integers(op, dtype):
    x = RNG.integers(-3, 3, (4, 6)).astype(dtype)
    check(op, {"x": x}, {"axis": 1, "select_last_index": 1}, opset=13)


@pytest.mark.parametrize("opset", opsets("TopK"))
@pytest.mark.parametrize("axis,k,largest", [(None, 3, None), (1, 1, None), (0, 3, 0),
                                            (-2, 5, 1), (2, 7, 0)])
def test_topk(axis, k, largest, opset):
    x = np.round(rand(RNG, 3, 5, 7) * np.float32(2))        # ties: the lower index first
    attrs = {} if axis is None else {"axis": axis}
    inits = {}
    if opset < 10:
        attrs["k"] = k
    else:
        inits["k"] = np.asarray([k], np.int64)
    if opset >= 11 and largest is not None:
        attrs["largest"] = largest
    check("TopK", {"x": x}, attrs, inits, opset=opset, outputs=2)


def test_topk_of_integers_sorted_attribute():
    x = RNG.integers(-20, 20, (2, 9)).astype(np.int64)
    check("TopK", {"x": x}, {"sorted": 1}, {"k": np.asarray([4], np.int64)}, opset=11,
          outputs=2)


@pytest.mark.parametrize("opset", opsets("CumSum"))
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(axis, exclusive, reverse, opset):
    check("CumSum", {"x": rand(RNG, 3, 5, 7)}, {"exclusive": exclusive, "reverse": reverse},
          {"axis": np.asarray(axis, np.int64)}, opset=opset)


def test_cumsum_of_int64_position_ids():
    """The attention mask's running count that gives position ids."""
    mask = (RNG.random((2, 11)) < 0.8).astype(np.int64)
    check("CumSum", {"mask": mask}, {}, {"axis": np.asarray([1], np.int32)}, opset=14)


EINSUMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 4), (2, 3, 6, 4)]),          # attention scores
    ("bhqk,bhkd->bhqd", [(1, 2, 5, 6), (1, 2, 6, 3)]),          # attention output
    ("bnd,hd->bnh", [(2, 5, 4), (3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("ij->ji", [(3, 5)]),
    ("ii->i", [(4, 4)]),
    ("i,j", [(3,), (4,)]),                                      # implicit output: ij
    ("ij,jk,k->i", [(3, 4), (4, 5), (5,)]),
    ("bid,bjd", [(2, 3, 4), (2, 5, 4)]),                        # implicit: bij
]


@pytest.mark.parametrize("opset", opsets("Einsum"))
@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum(equation, shapes, opset):
    inputs = {f"x{k}": rand(RNG, *s) for k, s in enumerate(shapes)}
    check("Einsum", inputs, {"equation": equation}, opset=opset)


def test_parse_einsum_spells_out_the_ellipsis_from_the_right():
    assert parse_einsum("...ij,j->...i", [4, 1]) == (["abij", "j"], "abi")
    assert parse_einsum("...ij,...j", [4, 2]) == (["abij", "bj"], "abi")
    assert parse_einsum("b...d,d...", [3, 2]) == (["bad", "da"], "ab")


@pytest.mark.parametrize("op,inputs,attrs,inits,opset,reason", [
    ("ReduceL2", {"x": np.ones((2, 3), np.int32)}, {}, {}, 13, "ReduceL2 of int32"),
    ("ReduceLogSumExp", {"x": np.ones((2, 3), np.float64)}, {}, {}, 13, "of float64"),
    ("ReduceMean", {"x": np.ones((2, 3), np.int32)}, {}, {}, 13, "ReduceMean of int32"),
    ("ArgMax", {"x": np.ones((2, 3), np.float64)}, {}, {}, 13, "ArgMax of float64"),
    ("Einsum", {"a": np.ones((2, 3), np.float32), "b": np.ones((1, 3), np.float32)},
     {"equation": "ij,ij->ij"}, {}, 12, "broadcasting a dimension of 1 against 2"),
    ("TopK", {"x": np.ones((1, MAX_SCAN_AXIS + 1), np.float32)}, {},
     {"k": np.asarray([2], np.int64)}, 13, f"axis of {MAX_SCAN_AXIS + 1} elements"),
    ("CumSum", {"x": np.ones((2, 3), np.float64)}, {}, {"axis": np.asarray(0)}, 14,
     "CumSum of float64"),
])
def test_refused_forms_are_named(op, inputs, attrs, inits, opset, reason):
    model = one_node_model(op, inputs, attrs, inits, opset=opset, outputs=2 if op == "TopK" else 1)
    with pytest.raises(UnsupportedOperatorError, match=reason):
        relay.frontend.from_onnx(model)
