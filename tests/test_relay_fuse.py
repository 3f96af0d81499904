"""Operator fusion (``relay.fuse.partition``): elementwise diamonds (GELU, SiLU, HardSwish,
``x * x``) run in their producer's kernel, what is read outside a group is its output, and the
groups run in an order where every input is computed first; the fused networks against
onnxruntime."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay.fuse import MAX_GROUP, partition  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from kernelrpc.relay.transform import optimize  # noqa: E402

RNG = np.random.default_rng(11)


def scalar(name, value):
    return numpy_helper.from_array(np.float32(value), name)


def model(nodes, inits, x_shape, anchor="conv"):
    """``nodes`` after an anchor that makes ``c`` from the input ``x``: a 3x3 convolution
    (8 -> 16 channels) or a dense layer (MatMul + bias, 16 -> 24)."""
    if anchor == "conv":
        head = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
        weights = [numpy_helper.from_array(RNG.standard_normal((16, 8, 3, 3)).astype("float32")
                                           * 0.3, "w")]
    else:
        head = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
                helper.make_node("Add", ["mm", "b"], ["c"])]
        weights = [numpy_helper.from_array(RNG.standard_normal((16, 24)).astype("float32")
                                           * 0.3, "w")]
    channels = 16 if anchor == "conv" else 24
    bias = RNG.standard_normal(channels).astype("float32") * 0.1
    weights.append(numpy_helper.from_array(bias, "b"))
    graph = helper.make_graph(head + nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                               for o in ("y", "z") if any(o in n.output for n in nodes)],
                              weights + inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def silu():
    return [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]


def hardswish():
    return [helper.make_node("Add", ["c", "three"], ["a"]),
            helper.make_node("Clip", ["a", "zero", "six"], ["cl"]),
            helper.make_node("Mul", ["c", "cl"], ["m"]),
            helper.make_node("Div", ["m", "six"], ["y"])]


def gelu():
    return [helper.make_node("Div", ["c", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["c", "e1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"])]


def gelu_tanh():
    """GPT-2's: ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``."""
    return [helper.make_node("Pow", ["c", "three"], ["p"]),
            helper.make_node("Mul", ["p", "k"], ["pk"]),
            helper.make_node("Add", ["c", "pk"], ["a"]),
            helper.make_node("Mul", ["a", "s2pi"], ["t0"]),
            helper.make_node("Tanh", ["t0"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["t1"]),
            helper.make_node("Mul", ["c", "t1"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"])]


def square():
    return [helper.make_node("Mul", ["c", "c"], ["y"])]


CONSTANTS = [scalar("three", 3), scalar("zero", 0), scalar("six", 6), scalar("one", 1),
             scalar("half", 0.5), scalar("sqrt2", np.sqrt(2)), scalar("k", 0.044715),
             scalar("s2pi", np.sqrt(2 / np.pi))]
CASES = {"SiLU": silu, "HardSwish": hardswish, "GELU": gelu, "GELU tanh": gelu_tanh,
         "x*x": square}


def build_and_run(m, x):
    mod, params = relay.frontend.from_onnx(m)
    lib = relay.build(mod, target="llvm", params=params)
    g = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    g.set_input(x=x)
    g.run()
    return lib, [g.get_output(k).numpy() for k in range(g.get_num_outputs())]


def used(nodes):
    names = {i for n in nodes for i in n.input}
    return [c for c in CONSTANTS if c.name in names]


def check(m, x, got):
    for g, w in zip(got, onnxruntime_outputs(m, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("case", list(CASES))
def test_an_elementwise_diamond_runs_in_its_dense_layers_kernel(case):
    nodes = CASES[case]()
    m = model(nodes, used(nodes), [5, 16], "dense")
    x = RNG.standard_normal((5, 16)).astype("float32")
    lib, got = build_and_run(m, x)
    kernels = lib.executor["kernels"]
    assert [k["fused"][0] for k in kernels] == ["nn.dense"], [k["kind"] for k in kernels]
    check(m, x, got)


@pytest.mark.parametrize("case", ["SiLU", "x*x"])
def test_a_convolutions_diamond_is_a_kernel_of_its_own(case):
    """A convolution's output stages write tiles narrower than a vector (Winograd's m
    columns): its diamond runs as an elementwise kernel, in whole vectors."""
    nodes = CASES[case]()
    m = model(nodes, used(nodes), [1, 8, 9, 11], "conv")
    x = RNG.standard_normal((1, 8, 9, 11)).astype("float32")
    lib, got = build_and_run(m, x)
    kinds = [k["fused"] for k in lib.executor["kernels"]]
    assert len(kinds) == 2 and kinds[0][0] == "nn.conv2d" and "multiply" in kinds[1], kinds
    check(m, x, got)


def groups_of(m):
    return partition(optimized(m))


def optimized(m):
    mod, params = relay.frontend.from_onnx(m)
    return optimize(mod["main"], params)


def test_a_value_read_by_branches_that_do_not_meet_is_its_groups_output():
    """Two graph outputs from one dense layer: the branches never meet, so its output is
    materialized and each branch is a kernel of its own."""
    nodes = [helper.make_node("Sigmoid", ["c"], ["y"]), helper.make_node("Tanh", ["c"], ["z"])]
    groups = groups_of(model(nodes, [], [5, 16], "dense"))
    assert len(groups) == 3 and [g.output.op for g in groups[1:]] == ["sigmoid", "tanh"]
    assert groups[0].anchor.op == "nn.dense" and len(groups[1].nodes) == len(groups[2].nodes) == 1


def test_a_diamond_whose_inner_value_is_a_graph_output_is_not_fused():
    nodes = [helper.make_node("Sigmoid", ["c"], ["z"]), helper.make_node("Mul", ["c", "z"], ["y"])]
    m = model(nodes, [], [5, 16], "dense")
    groups = groups_of(m)
    assert [g.output.op for g in groups[1:]] == ["sigmoid", "multiply"]
    assert [n.op for n in groups[0].nodes if n.op in ("sigmoid", "multiply")] == []
    x = RNG.standard_normal((5, 16)).astype("float32")
    _, got = build_and_run(m, x)
    check(m, x, got)


def test_a_diamond_through_a_reduction_is_not_fused():
    """Softmax normalizes each row with all its values: its branch leaves the loops of the
    dense layer's output, so the diamond stays cut."""
    nodes = [helper.make_node("Softmax", ["c"], ["s"], axis=-1),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    groups = groups_of(model(nodes, [], [5, 16], "dense"))
    assert any("nn.softmax" in [n.op for n in g.nodes] for g in groups)
    assert not any(g.anchor is not None and g.anchor.op == "nn.dense" and
                   "multiply" in [n.op for n in g.nodes] for g in groups)


@pytest.mark.parametrize("length, fused", [(MAX_GROUP - 4, True), (MAX_GROUP, False)])
def test_a_diamond_past_the_largest_group_is_not_fused(length, fused):
    branch = [helper.make_node("Sigmoid", ["c"], ["t0"])]
    for k in range(length):
        branch.append(helper.make_node("Sigmoid", [f"t{k}"], [f"t{k + 1}"]))
    branch.append(helper.make_node("Mul", ["c", f"t{length}"], ["y"]))
    groups = groups_of(model(branch, [], [5, 16], "dense"))
    assert all(len(g.nodes) <= MAX_GROUP for g in groups)
    assert any("multiply" in [n.op for n in g.nodes] and g.anchor is not None
               for g in groups) == fused


UNARY = ["Sigmoid", "Tanh", "Relu", "Neg", "Abs"]
BINARY = ["Add", "Mul", "Sub", "Max"]


@st.composite
def elementwise_graphs(draw):
    """A random DAG of elementwise operators over a dense layer's output (each node reads
    one or two earlier values), some of its values graph outputs."""
    values = ["c"]
    nodes = []
    for k in range(draw(st.integers(1, 12))):
        name = f"v{k}"
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY))
            nodes.append(helper.make_node(op, [draw(st.sampled_from(values))], [name]))
        else:
            op = draw(st.sampled_from(BINARY))
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            nodes.append(helper.make_node(op, [a, b], [name]))
        values.append(name)
    outputs = {values[-1]} | set(draw(st.lists(st.sampled_from(values[1:]), max_size=2)))
    return nodes, sorted(outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elementwise_graphs())
def test_groups_read_only_outputs_of_earlier_groups(graph):
    nodes, outputs = graph
    head = [helper.make_node("MatMul", ["x", "w"], ["c"])]
    g = helper.make_graph(head + nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                           for o in outputs],
                          [numpy_helper.from_array(np.ones((16, 8), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    func = optimized(m)
    groups = partition(func)
    outputs = {id(o) for o in func.outputs}
    computed = set()
    for group in groups:
        assert len(group.nodes) <= MAX_GROUP
        members = {id(n) for n in group.nodes}
        for i in group.inputs():
            assert i.op in ("input", "param", "const") or id(i) in computed
        for node in group.nodes[:-1]:
            readers = [r for other in groups if other is not group for r in other.nodes
                       if node in r.inputs]
            assert not readers, f"{node.op} is read outside its group but is not its output"
            assert id(node) not in outputs
        assert len(members) == len(group.nodes)
        computed.add(id(group.output))
