"""Shape and constant arithmetic evaluated at import: whatever chain an exporter writes from
input shapes, initializers and constants (Shape, Size, Range, Expand, Tile, ConstantOfShape,
Equal/Less/Where, Concat/Slice/Gather, Cast, If) becomes constants, and an input fixed with
``const_inputs=`` (``--const NAME=VALUE``) folds the branches that read it."""
import json
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_check import build, check_graph, compare, graph_model, run  # noqa: E402
from servicectl import child_env  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.model import build_parser  # noqa: E402
from kernelrpc.relay import ModelError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(5)
N = helper.make_node


def _ops(model, **import_args):
    mod, _ = relay.frontend.from_onnx(model, **import_args)
    return {node.op for node in mod["main"].topo()} - {"input", "param", "const"}


def _scalar(name, value, dtype=np.int64):
    return N("Constant", [], [name], value=helper.make_tensor(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [], [value]))


def test_an_anchor_grid_from_the_input_shape_folds_to_a_constant():
    """A YOLOv8-style head: grid x/y from Range over the feature map's height and width
    (read through Shape and Gather), Expand to the grid, Concat, Cast, Tile over the batch;
    only the Add onto the feature map remains."""
    x = np.asarray(RNG.standard_normal((2, 2, 3, 5)), np.float32)
    nodes = [N("Shape", ["x"], ["s"]),
             _scalar("i2", 2), _scalar("i3", 3), _scalar("zero", 0), _scalar("one", 1),
             N("Gather", ["s", "i2"], ["h"]), N("Gather", ["s", "i3"], ["w"]),
             N("Range", ["zero", "h", "one"], ["ry"]), N("Range", ["zero", "w", "one"], ["rx"]),
             N("Unsqueeze", ["ry", "ax1"], ["ry1"]),
             N("Slice", ["s", "two1", "four1"], ["hw"]),
             N("Expand", ["ry1", "hw"], ["gy"]), N("Expand", ["rx", "hw"], ["gx"]),
             N("Unsqueeze", ["gy", "ax0"], ["gy0"]), N("Unsqueeze", ["gx", "ax0"], ["gx0"]),
             N("Concat", ["gx0", "gy0"], ["grid_i"], axis=0),
             N("Cast", ["grid_i"], ["grid"], to=TensorProto.FLOAT),
             N("Unsqueeze", ["grid", "ax0"], ["grid1"]),
             N("Slice", ["s", "zero1", "one1"], ["batch"]),
             N("ConstantOfShape", ["three"], ["ones"],
               value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
             N("Concat", ["batch", "ones"], ["reps"], axis=0),
             N("Tile", ["grid1", "reps"], ["grids"]),
             N("Add", ["x", "grids"], ["y"])]
    inits = {"ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64),
             "zero1": np.array([0], np.int64), "one1": np.array([1], np.int64),
             "two1": np.array([2], np.int64), "four1": np.array([4], np.int64),
             "three": np.array([3], np.int64)}
    check_graph(nodes, {"x": x}, inits=inits)
    assert _ops(graph_model(nodes, {"x": x}, ["y"], inits)) == {"add"}


def test_masks_from_shapes_fold():
    """A causal mask built from Range, Less and Where on the sequence length."""
    x = np.asarray(RNG.standard_normal((1, 6, 6)), np.float32)
    nodes = [N("Shape", ["x"], ["s"], start=-1), N("Squeeze", ["s"], ["n"]),
             _scalar("zero", 0), _scalar("one", 1),
             N("Range", ["zero", "n", "one"], ["r"]),
             N("Unsqueeze", ["r", "ax"], ["col"]),
             N("Less", ["r", "col"], ["future"]),
             N("Equal", ["r", "col"], ["diagonal"]), N("Not", ["diagonal"], ["off"]),
             N("And", ["future", "off"], ["masked"]),
             N("Where", ["masked", "low", "x"], ["y"])]
    inits = {"ax": np.array([1], np.int64), "low": np.asarray(-1e4, np.float32)}
    check_graph(nodes, {"x": x}, inits=inits, opset=15)
    assert _ops(graph_model(nodes, {"x": x}, ["y"], inits, opset=15)) == {"where"}


def _branching_model():
    """An audio network's form: If on the sample-rate input picks its own layers."""
    then = helper.make_graph([N("Mul", ["x", "two"], ["t"])], "then", [],
                             [helper.make_empty_tensor_value_info("t")])
    other = helper.make_graph([N("Relu", ["x"], ["e0"]), N("Neg", ["e0"], ["e"])], "else", [],
                              [helper.make_empty_tensor_value_info("e")])
    nodes = [N("Equal", ["sr", "rate"], ["is16k"]),
             N("If", ["is16k"], ["y"], then_branch=then, else_branch=other)]
    inputs = {"x": np.asarray(RNG.standard_normal((2, 7)), np.float32),
              "sr": np.asarray(16000, np.int64)}
    inits = {"two": np.asarray(2.0, np.float32), "rate": np.asarray(16000, np.int64)}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7]),
                     helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7])],
        [helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(v.dtype), [], [v.item()])
         for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, inputs


@pytest.mark.parametrize("rate", [16000, 8000])
def test_an_if_on_an_input_fixed_at_import_keeps_the_branch_taken(rate):
    model, inputs = _branching_model()
    module = build(model, const_inputs={"sr": rate})
    expect = onnxruntime_outputs(model, {**inputs, "sr": np.asarray(rate, np.int64)})
    compare(run(module, {"x": inputs["x"]}), expect)
    assert _ops(model, const_inputs={"sr": rate}) == ({"multiply"} if rate == 16000 else
                                                      {"relu", "negative"})


@pytest.mark.parametrize("value,match", [
    ({"rate": 1}, "not an input"),
    ({"sr": 16000.5}, "not exactly a int64"),
    ({"sr": [16000, 8000]}, "has shape"),
    ({"sr": "16k"}, "not a int64"),
])
def test_const_inputs_are_validated(value, match):
    model, _ = _branching_model()
    with pytest.raises(ModelError, match=match):
        relay.frontend.from_onnx(model, const_inputs=value)


def test_a_scalar_fixes_a_one_element_input_and_a_shape_with_it_is_refused():
    model, inputs = _branching_model()
    model.graph.input[1].type.tensor_type.shape.dim.add().dim_value = 1
    assert _ops(model, const_inputs={"sr": 8000}) == {"relu", "negative"}
    with pytest.raises(ModelError, match="both a shape and a constant"):
        relay.frontend.from_onnx(model, shape={"sr": (1,)}, const_inputs={"sr": 8000})


def test_the_model_command_takes_const_values(tmp_path):
    """``--const`` parsed, and a run with it agrees with onnxruntime fed the same value."""
    args = build_parser().parse_args(["m.onnx", "--const", "sr=16000", "--const", "w=0.5,2"])
    assert args.const == [("sr", 16000), ("w", [0.5, 2])]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["m.onnx", "--const", "sr"])
    model, _ = _branching_model()
    onnx.save(model, str(tmp_path / "vad.onnx"))
    done = subprocess.run([sys.executable, "-m", "kernelrpc.model", "vad.onnx", "--local", "--json",
                           "--const", "sr=8000", "--repeat", "1", "--number", "1",
                           "--db", str(tmp_path / "results.sqlite")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=child_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["inputs"] == [{"name": "x", "shape": [2, 7], "dtype": "float32"}]
    assert report["onnxruntime"]["outputs"][0]["relative"] < 1e-6
