"""``transform.merge_common``: what an exporter writes once for each reader of a tensor (a
reshape of it, its dynamic quantization) is computed once; operators that differ in an
attribute or an input, and large constants, stay apart; the network still agrees with
onnxruntime, an output computed twice included."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from onnx_check import graph_model, run_model  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay.transform import MERGED_CONST_SIZE, optimize  # noqa: E402

RNG = np.random.default_rng(9)
N = helper.make_node


def _optimized(model):
    mod, params = relay.frontend.from_onnx(model)
    return [n for n in optimize(mod["main"], params).topo()]


def test_readers_of_one_tensor_share_its_reshape_and_what_follows():
    """Three reshapes of ``x`` to one shape (each with its own shape constant, as exporters
    write them) and a Relu after each: one reshape, one Relu; the reshape to another shape
    and the Relu of a Sigmoid stay."""
    x = RNG.standard_normal((2, 3, 4)).astype("float32")
    shapes = {f"s{k}": np.array([6, 4], np.int64) for k in range(3)}
    shapes["t"] = np.array([4, 6], np.int64)
    nodes = [N("Reshape", ["x", s], [f"r{s}"]) for s in shapes]
    nodes += [N("Relu", [f"r{s}"], [f"y{s}"]) for s in shapes]
    nodes += [N("Sigmoid", ["x"], ["g"]), N("Relu", ["g"], ["yg"])]
    outputs = [f"y{s}" for s in shapes] + ["yg"]
    model = graph_model(nodes, {"x": x}, outputs, inits=shapes)
    nodes = _optimized(model)
    assert sorted(n.op for n in nodes if n.op not in ("input", "const")) == \
        ["relu", "relu", "relu", "reshape", "reshape", "sigmoid"]
    run_model(model, {"x": x})


def test_small_constants_merge_by_value_and_large_ones_stay_apart():
    """Adds of equal constants: one add where the constant is small, two where each is its
    own weight (a large constant is compared by identity, not by its bytes)."""
    for size, adds in ((4, 1), (MERGED_CONST_SIZE + 1, 2)):
        x = RNG.standard_normal((size,)).astype("float32")
        value = RNG.standard_normal((size,)).astype("float32")
        model = graph_model([N("Add", ["x", "a"], ["ya"]), N("Add", ["x", "b"], ["yb"])],
                            {"x": x}, ["ya", "yb"], inits={"a": value, "b": value.copy()})
        assert sum(n.op == "add" for n in _optimized(model)) == adds, size
        run_model(model, {"x": x})
