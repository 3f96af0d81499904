"""A model kernelrpc cannot compile gets one typed error that names the problem and the fix,
before any build work; a malformed file, a missing shape or a wrong input are typed errors."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay import MissingShapeError, ModelError, UnsupportedOperatorError  # noqa: E402


def model_of(nodes, inputs, inits=(), opset=13, outputs=("y",)):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, n) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_every_unsupported_operator_is_listed_at_once():
    model = model_of([helper.make_node("Relu", ["x"], ["a"], name="ok"),
                      helper.make_node("Unique", ["a"], ["b"], name="u1"),
                      helper.make_node("NonZero", ["b"], ["y"], name="n1"),
                      helper.make_node("Custom", ["x"], ["z"], domain="com.example", name="c1")],
                     [("x", [2, 3])], [("k", np.array([1], np.int64))])
    with pytest.raises(UnsupportedOperatorError) as info:
        relay.frontend.from_onnx(model)
    found = {(op, name) for op, name, _, _ in info.value.unsupported}
    assert found == {("Unique", "u1"), ("NonZero", "n1"), ("com.example.Custom", "c1")}
    assert "3 operator(s)" in str(info.value) and "opset 13" in str(info.value)


def test_an_attribute_the_importer_does_not_implement_is_an_error_not_ignored():
    model = model_of([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                       storage_order=1, name="pool"),
                      helper.make_node("Relu", ["x"], ["z"], name="r", unknown_flag=1)],
                     [("x", [1, 1, 4, 4])], outputs=("y", "z"))
    with pytest.raises(UnsupportedOperatorError) as info:
        relay.frontend.from_onnx(model)
    reasons = {name: why for _, name, _, why in info.value.unsupported}
    assert "storage_order" in reasons["pool"] and "unknown_flag" in reasons["r"]


def test_an_unused_second_output_is_fine_but_a_used_one_is_refused():
    pool = helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2, 2], name="p")
    relay.frontend.from_onnx(model_of([pool], [("x", [1, 2, 4, 4])]))
    use = helper.make_node("Relu", ["idx"], ["z"])
    with pytest.raises(UnsupportedOperatorError, match="output 1"):
        relay.frontend.from_onnx(model_of([pool, use], [("x", [1, 2, 4, 4])],
                                          outputs=("y", "z")))


def test_malformed_files_and_bad_inputs(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xff\xff")
    with pytest.raises(ModelError, match="not a readable ONNX file"):
        relay.frontend.from_onnx(str(bad))
    with pytest.raises(ModelError, match="no model file"):
        relay.frontend.from_onnx(str(tmp_path / "missing.onnx"))
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    dynamic = model_of(relu, [("x", ["batch", 3])])
    with pytest.raises(MissingShapeError, match="shape=.*'x'"):
        relay.frontend.from_onnx(dynamic)
    mod, _ = relay.frontend.from_onnx(dynamic, shape={"x": (4, 3)})
    assert mod["main"].inputs[0].shape == (4, 3)
    with pytest.raises(ModelError, match="not an input"):
        relay.frontend.from_onnx(dynamic, shape={"x": (4, 3), "nope": (1,)})
    with pytest.raises(ModelError, match="dimension 1 is 3"):
        relay.frontend.from_onnx(dynamic, shape={"x": (4, 5)})
    with pytest.raises(ModelError, match="opset 7"):
        relay.frontend.from_onnx(model_of(relu, [("x", [2, 3])], opset=7))


def test_inconsistent_shapes_name_the_node():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv_a")
    model = model_of([conv], [("x", [1, 3, 8, 8])], [("w", np.zeros((4, 5, 3, 3), np.float32))])
    with pytest.raises(ModelError, match="conv_a.*input channels"):
        relay.frontend.from_onnx(model)


def test_build_without_params_says_how():
    model = model_of([helper.make_node("Mul", ["x", "w"], ["y"])], [("x", [2])],
                     [("w", np.ones(2, np.float32))])
    mod, params = relay.frontend.from_onnx(model)
    with pytest.raises(ModelError, match="params="):
        relay.build(mod)
    with pytest.raises(ModelError, match="expects float32\\[2\\]"):
        relay.build(mod, params={"w": np.ones(3, np.float32)})


def test_batch_normalization_with_a_negative_variance_is_refused():
    stats = [("s", np.ones(2, np.float32)), ("b", np.zeros(2, np.float32)),
             ("m", np.zeros(2, np.float32)), ("v", np.array([1, -1], np.float32))]
    model = model_of([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                       name="bn")], [("x", [1, 2, 3, 3])], stats)
    with pytest.raises(ModelError, match="bn.*var \\+ epsilon must be positive"):
        relay.frontend.from_onnx(model)


def test_nodes_downstream_of_a_refused_node_are_checked_too():
    """Shape inference stands in for the refused Det: the MaxPool after it is still checked
    and refused; the Reshape whose shape comes from the MaxPool's through Shape is converted,
    and a node that needs a refused node's *value* is not blamed for it."""
    nodes = [helper.make_node("Det", ["x"], ["a"], name="det"),
             helper.make_node("Unsqueeze", ["a", "axes"], ["u"], name="unsqueeze"),
             helper.make_node("MaxPool", ["u"], ["b"], kernel_shape=[1, 1], storage_order=1,
                              name="pool"),
             helper.make_node("Shape", ["b"], ["s"], name="shape"),
             helper.make_node("Reshape", ["b", "s"], ["c"], name="reshape"),
             helper.make_node("Relu", ["c"], ["y"], name="relu"),
             helper.make_node("Cast", ["a"], ["dims"], to=TensorProto.INT64, name="cast"),
             helper.make_node("Reshape", ["x", "dims"], ["d"], name="by_value")]
    model = model_of(nodes, [("x", [1, 2, 3, 3])], [("axes", np.array([2, 3], np.int64))],
                     outputs=("y", "d"))
    with pytest.raises(UnsupportedOperatorError) as info:
        relay.frontend.from_onnx(model)
    assert [name for _, name, _, _ in info.value.unsupported] == ["det", "pool"]


def test_an_unimplemented_output_read_only_inside_a_branch_is_refused():
    pool = helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2], name="pool")
    then = helper.make_graph([helper.make_node("Cast", ["idx"], ["t"], to=TensorProto.FLOAT)],
                             "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT,
                                                                        None)])
    other = helper.make_graph([helper.make_node("Identity", ["p"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    branch = helper.make_node("If", ["yes"], ["y"], then_branch=then, else_branch=other)
    model = model_of([pool, branch], [("x", [1, 1, 4, 4])], [("yes", np.array(True))])
    with pytest.raises(UnsupportedOperatorError, match="output 1"):
        relay.frontend.from_onnx(model)
