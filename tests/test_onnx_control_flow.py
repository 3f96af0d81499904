"""ONNX control flow and sizes read at run time against onnxruntime: If decided at run time
(both branches built, the condition read on the device; nested, reading outer-scope tensors,
inside a Loop's body), Loop and Scan unrolled when their iterations are known at import
(carried values, scan outputs, the iteration number, a condition that folds), local functions
called from a branch, shapes, sizes, starts and pads read at run time where the output's shape
is static (values giving another shape stop the run), and the refusals, each naming what to
do."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_check import N, build, compare, graph_model, opsets, rand, run  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.errors import KernelError, RemoteError  # noqa: E402
from kernelrpc.relay import UnsupportedOperatorError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from test_relay_emulated import board_session, run_checked, tracker  # noqa: E402,F401

RNG = np.random.default_rng(33)


def _graph(name, nodes, outputs, inputs=()):
    """A subgraph; ``outputs``: names of float32 tensors, or ``(name, dtype)``; their shapes
    left to shape inference."""
    outputs = [(o, np.float32) if isinstance(o, str) else o for o in outputs]
    return helper.make_graph(nodes, name, list(inputs),
                             [_value(o, dtype, None) for o, dtype in outputs])


def _value(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         shape)


def _agrees(model, feeds_list, tol=1e-5, **import_args):
    """One build of ``model`` run on each of ``feeds_list``, every run checked against
    onnxruntime's."""
    module = build(model, **import_args)
    for feeds in feeds_list:
        compare(run(module, feeds), onnxruntime_outputs(model, feeds), tol)


def _ops(model, **import_args):
    mod, _ = relay.frontend.from_onnx(model, **import_args)
    return {node.op for node in mod["main"].topo()} - {"input", "param", "const"}


# ------------------------------------------------------------------ If at run time

def _sample_rate_model(else_nodes=None):
    """An audio network's form: If on the sample-rate input, each branch its own layers on
    the outer-scope ``x`` and weights."""
    then = _graph("then", [N("MatMul", ["x", "w"], ["t0"]), N("Add", ["t0", "b"], ["t"])], ["t"])
    other = _graph("else", else_nodes or [N("Relu", ["x"], ["e0"]), N("Neg", ["e0"], ["e1"]),
                                          N("Slice", ["e1", "s0", "s1", "s2"], ["e"])],
                   ["e"])
    nodes = [N("Equal", ["sr", "rate"], ["is16k"]),
             N("If", ["is16k"], ["y"], name="pick_rate", then_branch=then, else_branch=other)]
    inits = {"rate": np.asarray(16000, np.int64), "w": rand(RNG, 7, 5), "b": rand(RNG, 5),
             "s0": np.array([0], np.int64), "s1": np.array([5], np.int64),
             "s2": np.array([1], np.int64)}
    inputs = {"x": ((3, 7), np.float32), "sr": ((), np.int64)}
    return graph_model(nodes, inputs, ["y"], inits)


def _rate_feeds():
    x = rand(RNG, 3, 7)
    return [{"x": x, "sr": np.asarray(rate, np.int64)} for rate in (16000, 8000, 16000)]


def test_an_if_decided_at_run_time_takes_either_branch():
    """Both branches are built and the condition read on the device: fed either value, the
    same module follows onnxruntime."""
    model = _sample_rate_model()
    _agrees(model, _rate_feeds())
    assert {"where", "nn.dense", "relu"} <= _ops(model)


def test_branches_with_initializers_of_their_own():
    """A branch's own initializers are its constants (what torch writes as outer values, other
    exporters write into the branch)."""
    from onnx import numpy_helper

    then = _graph("then", [N("MatMul", ["x", "w1"], ["t"])], ["t"])
    then.initializer.append(numpy_helper.from_array(rand(RNG, 7, 5), "w1"))
    other = _graph("else", [N("MatMul", ["x", "w2"], ["e0"]), N("Add", ["e0", "w"], ["e"])],
                   ["e"])
    other.initializer.append(numpy_helper.from_array(rand(RNG, 7, 5), "w2"))
    nodes = [N("Equal", ["sr", "rate"], ["is16k"]),
             N("If", ["is16k"], ["y"], then_branch=then, else_branch=other)]
    inits = {"rate": np.asarray(16000, np.int64), "w": rand(RNG, 5)}
    model = graph_model(nodes, {"x": ((3, 7), np.float32), "sr": ((), np.int64)}, ["y"], inits)
    _agrees(model, _rate_feeds())


def test_an_if_fixed_at_import_still_keeps_only_its_branch():
    model = _sample_rate_model()
    assert "where" not in _ops(model, const_inputs={"sr": 8000})


def test_branches_of_different_shapes_are_refused_naming_the_input_to_fix():
    other = [N("Relu", ["x"], ["e"])]       # [3, 7] beside the then branch's [3, 5]
    model = _sample_rate_model(other)
    with pytest.raises(UnsupportedOperatorError, match=r"pick_rate.*\[3, 5\] float32 in the then "
                       r"branch and \[3, 7\] float32 in the else.*--const sr=VALUE"):
        relay.frontend.from_onnx(model)
    module = build(model, const_inputs={"sr": 8000})
    x = rand(RNG, 3, 7)
    compare(run(module, {"x": x}), onnxruntime_outputs(model, {"x": x, "sr": np.asarray(8000)}))


def test_refusals_inside_a_branch_are_all_reported():
    """The second pooling, downstream of the first refused one, is checked too (shape
    inference stands in for the first inside the branch as in the main graph)."""
    pool = {"kernel_shape": [1, 1], "storage_order": 1}
    other = [N("Relu", ["x"], ["e0"]),
             N("Constant", [], ["a01"], value=onnx.numpy_helper.from_array(_i64(0, 1))),
             N("Unsqueeze", ["e0", "a01"], ["e1"]),
             N("MaxPool", ["e1"], ["e2"], name="pool1", **pool),
             N("MaxPool", ["e2"], ["e3"], name="pool2", **pool),
             N("Squeeze", ["e3", "a01"], ["e"])]
    with pytest.raises(UnsupportedOperatorError, match=r"in the else branch, MaxPool \(node "
                       r"'pool1'\): storage_order=1.*; MaxPool \(node 'pool2'\)"):
        relay.frontend.from_onnx(_sample_rate_model(other))


def test_nested_ifs_read_outer_scope_tensors():
    """The inner If reads ``x`` two scopes up and the outer branch's own value; the conditions
    are two run-time inputs."""
    inner = helper.make_node(
        "If", ["b"], ["i"],
        then_branch=_graph("inner_then", [N("Mul", ["x", "o0"], ["it"])], ["it"]),
        else_branch=_graph("inner_else", [N("Identity", ["x"], ["ie"])], ["ie"]))
    then = _graph("outer_then", [N("Sigmoid", ["x"], ["o0"]), inner, N("Add", ["i", "o0"], ["o"])],
                  ["o"])
    other = _graph("outer_else", [N("Sub", ["x", "c"], ["p"])], ["p"])
    model = graph_model([N("If", ["a"], ["y"], then_branch=then, else_branch=other)],
                        {"x": ((2, 3, 4), np.float32), "a": ((1,), bool), "b": ((), bool)},
                        ["y"], {"c": rand(RNG, 4)})
    x = rand(RNG, 2, 3, 4)
    _agrees(model, [{"x": x, "a": np.array([a]), "b": np.asarray(b)}
                    for a in (True, False) for b in (True, False)])


@pytest.mark.parametrize("after", ["Identity", "MatMul"])
def test_an_index_out_of_range_in_the_branch_not_taken_is_never_read(after):
    """Both branches run: an embedding lookup out of range in the branch not taken either
    stops the run (its gather computed in a kernel of its own) or is skipped (its reads
    fused under the selection), never a read outside the table; onnxruntime runs the branch
    taken only."""
    then = _graph("then", [N("Gather", ["table", "ids"], ["t0"]), N(after, ["t0", "w"][
        :2 if after == "MatMul" else 1], ["t"])], ["t"])
    other = _graph("else", [N("Gather", ["table", "zeros"], ["e0"]), N(after, ["e0", "w"][
        :2 if after == "MatMul" else 1], ["e"])], ["e"])
    model = graph_model([N("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                        {"ids": ((3,), np.int64), "c": ((), bool)}, ["y"],
                        {"table": rand(RNG, 5, 2), "zeros": np.zeros(3, np.int64),
                         "w": rand(RNG, 2, 2)})
    module = build(model)
    for ids, c in (([4, -5, 1], True), ([4, -5, 1], False), ([5, 0, 0], False)):
        feeds = {"ids": np.array(ids, np.int64), "c": np.asarray(c)}
        try:
            got = run(module, feeds)
        except KernelError as exc:
            assert ids[0] == 5 and "out of bounds" in str(exc)
            continue
        compare(got, onnxruntime_outputs(model, feeds))


# ------------------------------------------------------------------ Loop

def _loop_model(trips=4, cond_nodes=None, cond_out="keep", extra_inputs=None, opset=13,
                steps=5):
    """A recurrence ``h = tanh(h @ w + x[i])`` over the iteration number ``i`` (carried ``h``
    and a step count), scanning out ``h`` and ``i * 2``; the condition ``cond_nodes`` give."""
    body = _graph("body", [
        N("Gather", ["x", "i"], ["xi"]),
        N("MatMul", ["h", "w"], ["hw"]), N("Add", ["hw", "xi"], ["h0"]), N("Tanh", ["h0"], ["h1"]),
        N("Add", ["n", "one"], ["n1"]),
        N("Mul", ["i", "two"], ["i2"]),
        *(cond_nodes if cond_nodes is not None else [N("Identity", ["c"], ["keep"])])],
        [(cond_out, bool), "h1", ("n1", np.int64), "h1", ("i2", np.int64)],
        [_value("i", np.int64, []), _value("c", bool, []), _value("h", np.float32, [2, 3]),
         _value("n", np.int64, [])])
    nodes = [N("Loop", ["trips", "go", "h_init", "zero"], ["h_last", "n_last", "hs", "is"],
               name="steps", body=body)]
    inits = {"w": rand(RNG, 3, 3), "one": np.asarray(1, np.int64), "two": np.asarray(2, np.int64),
             "zero": np.asarray(0, np.int64), "go": np.asarray(True)}
    if trips is not None:
        inits["trips"] = np.asarray(trips, np.int64)
    inputs = {"x": ((steps, 2, 3), np.float32), "h_init": ((2, 3), np.float32),
              **(extra_inputs or {})}
    return graph_model(nodes, inputs, ["h_last", "n_last", "hs", "is"], inits, opset)


def _loop_feeds(**extra):
    return [{"x": rand(RNG, 5, 2, 3), "h_init": rand(RNG, 2, 3), **extra}]


@pytest.mark.parametrize("opset", opsets("Loop"))
def test_a_loop_of_known_trips_is_unrolled_with_carried_values_and_scan_outputs(opset):
    _agrees(_loop_model(opset=opset), _loop_feeds())


def test_a_loop_condition_that_folds_ends_it_early():
    """``i < 2``, computed from the iteration number, stops a loop of trip count 5 after 3."""
    model = _loop_model(trips=5, cond_nodes=[N("Less", ["i", "two"], ["keep"])])
    _agrees(model, _loop_feeds())
    model = _loop_model(trips=None, cond_nodes=[N("Less", ["i", "two"], ["keep"])])
    model.graph.node[0].input[0] = ""
    _agrees(model, _loop_feeds())


def test_an_if_inside_a_loop_body():
    """One If on the iteration number (folds in each copy of the body) and one on an input
    (decided at run time in every copy)."""
    by_step = N("If", ["early"], ["s"], then_branch=_graph("t", [N("Neg", ["h1"], ["sn"])], ["sn"]),
                else_branch=_graph("e", [N("Abs", ["h1"], ["sa"])], ["sa"]))
    by_input = N("If", ["flag"], ["keep_h"],
                 then_branch=_graph("t2", [N("Identity", ["s"], ["si"])], ["si"]),
                 else_branch=_graph("e2", [N("Mul", ["s", "half"], ["sh"])], ["sh"]))
    body = _graph("body", [N("Less", ["i", "two"], ["early"]), N("Tanh", ["h"], ["h1"]),
                           by_step, by_input, N("Identity", ["c"], ["keep"])],
                  [("keep", bool), "keep_h", "s"],
                  [_value("i", np.int64, []), _value("c", bool, []),
                   _value("h", np.float32, [2, 3])])
    model = graph_model([N("Loop", ["trips", "", "h_init"], ["h_last", "ss"], body=body)],
                        {"h_init": ((2, 3), np.float32), "flag": ((), bool)}, ["h_last", "ss"],
                        {"trips": np.asarray(4, np.int64), "two": np.asarray(2, np.int64),
                         "half": np.asarray(0.5, np.float32)})
    h = rand(RNG, 2, 3)
    _agrees(model, [{"h_init": h, "flag": np.asarray(f)} for f in (True, False)])


@pytest.mark.parametrize("case,match", [
    ("data condition", r"steps.*computes its condition from data at run time"),
    ("run-time trips", r"Loop's trip count M must be a constant.*--const"),
    ("too many", r"runs 300 iterations; at most 256"),
    ("endless", r"condition still holds after 256 iterations"),
    ("too large", r"unrolled 200 times is more than 20000 nodes"),
])
def test_loops_not_known_at_import_are_refused(case, match):
    if case == "data condition":        # stop once h's sum is positive: a run-time decision
        model = _loop_model(cond_nodes=[N("ReduceSum", ["h1"], ["total"], keepdims=0),
                                        N("Less", ["total", "zf"], ["keep"])])
        model.graph.initializer.append(helper.make_tensor("zf", TensorProto.FLOAT, [], [0.0]))
    elif case == "run-time trips":
        model = _loop_model(trips=None, extra_inputs={"trips": ((), np.int64)})
    elif case == "too many":
        model = _loop_model(trips=300)
    elif case == "endless":
        model = _loop_model(trips=None, steps=300)
        model.graph.node[0].input[0] = ""
    else:
        model = _loop_model(trips=200)
        body = model.graph.node[0].attribute[0].g
        body.node.extend(N("Identity", ["h1"], [f"pad{k}"]) for k in range(100))
    with pytest.raises(UnsupportedOperatorError, match=match):
        relay.frontend.from_onnx(model)


# ------------------------------------------------------------------ Scan

@pytest.mark.parametrize("opset", opsets("Scan"))
def test_scan_with_axes_and_directions(opset):
    """A running sum over axis 1 of one input read backwards, and a product with another
    read along axis 0; the scan outputs stacked along axis 1, one of them reversed."""
    body = _graph("body", [N("Add", ["acc", "a"], ["acc1"]), N("Mul", ["acc1", "b"], ["p"]),
                           N("Identity", ["acc1"], ["sum"])],
                  ["acc1", "sum", "p"],
                  [_value("acc", np.float32, [3]), _value("a", np.float32, [3]),
                   _value("b", np.float32, [3])])
    scan = N("Scan", ["acc0", "xs", "ys"], ["acc_last", "sums", "prods"], body=body,
             num_scan_inputs=2, scan_input_axes=[1, 0], scan_input_directions=[1, 0],
             scan_output_axes=[1, -1], scan_output_directions=[0, 1])
    model = graph_model([scan], {"acc0": ((3,), np.float32), "xs": ((3, 4), np.float32),
                                 "ys": ((4, 3), np.float32)},
                        ["acc_last", "sums", "prods"], opset=opset)
    _agrees(model, [{"acc0": rand(RNG, 3), "xs": rand(RNG, 3, 4), "ys": rand(RNG, 4, 3)}])


# ------------------------------------------------------------------ local functions

def test_branches_calling_local_functions_are_inlined():
    """The form an exporter writes for a module kept whole: a function of the model called
    inside both branches of an If decided at run time."""
    scale = helper.make_function("local", "ScaleShift", ["v", "k"], ["r"],
                                 [N("Mul", ["v", "k"], ["m"]), N("Add", ["m", "k"], ["r"])],
                                 [helper.make_opsetid("", 13)])
    then = _graph("then", [N("ScaleShift", ["x", "two"], ["t"], domain="local")], ["t"])
    other = _graph("else", [N("Relu", ["x"], ["r0"]),
                            N("ScaleShift", ["r0", "three"], ["e"], domain="local")], ["e"])
    graph = helper.make_graph(
        [N("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [_value("x", np.float32, [2, 5]), _value("c", bool, [])], [_value("y", np.float32, [2, 5])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])])
    model = helper.make_model(graph, functions=[scale], opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    model.ir_version = 8
    x = rand(RNG, 2, 5)
    _agrees(model, [{"x": x, "c": np.asarray(c)} for c in (True, False)])


def test_torch_cond_exported_by_dynamo():
    """``torch.cond`` on a sample rate, as torch's dynamo exporter writes it (an If whose
    branches are the two functions), run with either rate by one module."""
    torch = pytest.importorskip("torch")

    class Resample(torch.nn.Module):
        def forward(self, x, sr):
            return torch.cond(sr == 16000, lambda v: v * 2 + 1, lambda v: torch.relu(v) - 3, (x,))

    x = torch.randn(2, 7, generator=torch.Generator().manual_seed(3))
    program = torch.onnx.export(Resample().eval(), (x, torch.tensor(16000)), dynamo=True,
                                verbose=False)
    model = program.model_proto
    assert "If" in {node.op_type for node in model.graph.node}
    _agrees(model, [{"x": x.numpy(), "sr": np.asarray(rate, np.int64)} for rate in (16000, 8000)])


@pytest.mark.parametrize("last_calls,match", [(None, "more than 100000 nodes"),
                                              ("F3", "'F3' calls itself")])
def test_local_functions_that_multiply_or_recurse_are_refused(last_calls, match):
    """Twenty functions each calling the next twice would inline to a million nodes; a cycle
    of calls would never end: both are counted before inlining."""
    functions = []
    for k in range(20):
        callee = f"F{k + 1}" if k < 19 else last_calls
        nodes = [N(callee, ["v"], ["a"], domain="local"), N(callee, ["a"], ["r"], domain="local")] \
            if callee else [N("Relu", ["v"], ["r"])]
        functions.append(helper.make_function("local", f"F{k}", ["v"], ["r"], nodes,
                                              [helper.make_opsetid("", 13)]))
    graph = helper.make_graph([N("F0", ["x"], ["y"], domain="local")], "g",
                              [_value("x", np.float32, [2])], [_value("y", np.float32, [2])])
    model = helper.make_model(graph, functions=functions, opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    with pytest.raises(relay.ModelError, match=match):
        relay.frontend.from_onnx(model)


# ------------------------------------------------------------------ sizes read at run time

def _declare(model, shapes: dict):
    """``model`` with the shapes of ``shapes`` (name -> dims) written in its value_info, as an
    exporter that traced static shapes writes them."""
    infos = {info.name: info for info in list(model.graph.value_info) + list(model.graph.output)}
    for name, dims in shapes.items():
        info = infos.get(name) or model.graph.value_info.add(name=name)
        if not info.type.tensor_type.elem_type:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
        shape = info.type.tensor_type.shape
        del shape.dim[:]
        for d in dims:
            shape.dim.add().dim_value = d
    return model


def _i64(*values):
    return np.array(values, np.int64)


#: op, attrs, data shape, size input's shape, output shape, sizes that give it, sizes that
#: do not (onnxruntime computes another shape, or refuses them)
RUN_TIME_SIZES = {
    "Reshape": ({}, (3, 4), (3,), (3, 2, 2), [_i64(3, 2, 2), _i64(0, 2, 2), _i64(3, -1, 2)],
                [_i64(3, 4, 1), _i64(-1, -1, 2), _i64(0, 0, 2), _i64(2, 3, 2)]),
    "Expand": ({}, (1, 4), (2,), (3, 4), [_i64(3, 4), _i64(3, 1)], [_i64(2, 4), _i64(3, 2)]),
    "Tile": ({}, (2, 3), (2,), (4, 3), [_i64(2, 1)], [_i64(1, 2), _i64(3, 1)]),
    "Split": ({"axis": 1}, (2, 7), (2,), (2, 4), [_i64(4, 3)], [_i64(3, 4), _i64(4, 4)]),
    "Pad": ({}, (3, 4), (4,), (6, 5), [_i64(1, 0, 2, 1), _i64(3, 1, 0, 0), _i64(-1, 2, 4, -1)],
            [_i64(2, 0, 2, 1), _i64(0, 0, 0, 0), _i64(2**40, 0, 3 - 2**40, 1)]),
    "Pad/value": ({}, (3, 4), (4,), (6, 5), [_i64(1, 0, 2, 1), _i64(0, 2, 3, -1)],
                  [_i64(1, 1, 2, 1)]),
    "Pad/edge": ({"mode": "edge"}, (3, 4), (4,), (6, 5), [_i64(1, 0, 2, 1), _i64(-1, 2, 4, -1)],
                 [_i64(2, 0, 2, 0)]),
    "Pad/reflect": ({"mode": "reflect"}, (3, 4), (4,), (6, 5), [_i64(1, 0, 2, 1), _i64(2, 1, 1, 0)],
                    [_i64(3, 0, 0, 1), _i64(-1, 2, 4, -1)]),
}


def _size_case(op):
    attrs, data, spec, out, _, _ = RUN_TIME_SIZES[op]
    outputs = ["y", "z"] if op == "Split" else ["y"]
    inputs = {"x": (data, np.float32), "v": (spec, np.int64)}
    if op == "Pad/value":           # the pad value an input too
        inputs["fill"] = ((), np.float32)
    node = N(op.split("/")[0], list(inputs), outputs, **attrs)
    model = graph_model([node], inputs, outputs)
    rest = (data[0], data[1] - out[1]) if op == "Split" else None
    return _declare(model, {"y": out, **({"z": rest} if rest else {})}), data


@pytest.mark.parametrize("op", sorted(RUN_TIME_SIZES))
def test_sizes_read_at_run_time_where_the_output_shape_is_static(op):
    """The values that give the model's static output shape agree with onnxruntime; others
    stop the run (a KernelError), never a wrong answer."""
    model, data = _size_case(op)
    module = build(model)
    fixed = {"x": rand(RNG, *data)}
    if "value" in op:
        fixed["fill"] = np.asarray(-2.5, np.float32)
    for good in RUN_TIME_SIZES[op][4]:
        feeds = {**fixed, "v": good}
        compare(run(module, feeds), onnxruntime_outputs(model, feeds))
    for bad in RUN_TIME_SIZES[op][5]:
        with pytest.raises(KernelError, match="out of bounds"):
            run(module, {**fixed, "v": bad})


@pytest.mark.parametrize("step", [1, -1, 2])
def test_a_slice_at_run_time_starts_with_a_static_extent(step):
    """``x[p:p + 4*step:step]`` along axis 0 for a run-time ``p``: where the window is whole
    (negative starts and ends counted from the end) it agrees with onnxruntime; a window
    clamped shorter, or emptied by an end counted from the end, stops the run."""
    nodes = [N("Mul", ["four", "k"], ["span"]), N("Add", ["p", "span"], ["end"]),
             N("Slice", ["x", "p", "end", "zero", "k"], ["y"])]
    model = graph_model(nodes, {"x": ((10, 3), np.float32), "p": ((1,), np.int64)}, ["y"],
                        {"four": _i64(4), "k": _i64(step), "zero": _i64(0)})
    model = _declare(model, {"y": (4, 3)})
    module = build(model)
    x = rand(RNG, 10, 3)
    starts = {1: [0, 6, -5], -1: [9, 5, -1], 2: [0, 2, -10]}[step]
    for p in starts:
        feeds = {"x": x, "p": _i64(p)}
        compare(run(module, feeds), onnxruntime_outputs(model, feeds))
    for p in {1: [7, -2, 10], -1: [2, -9, 11, 3], 2: [7, 9, -1]}[step]:
        with pytest.raises(KernelError, match="out of bounds"):
            run(module, {"x": x, "p": _i64(p)})


@pytest.mark.parametrize("run_time", [False, True])
def test_a_backward_slice_from_before_the_start_keeps_the_first_element(run_time):
    """ONNX clamps a backward slice's start into ``[0, dim - 1]``: ``x[-100:-100:-1]`` is
    ``x[0:1]``, as onnxruntime computes it."""
    inits = {"e": _i64(-100), "a": _i64(0), "k": _i64(-1)}
    inputs = {"x": ((5, 2), np.float32)}
    if run_time:
        inputs["s"] = ((1,), np.int64)
    else:
        inits["s"] = _i64(-100)
    model = graph_model([N("Slice", ["x", "s", "e", "a", "k"], ["y"])], inputs, ["y"], inits)
    model = _declare(model, {"y": (1, 2)})
    feeds = {"x": rand(RNG, 5, 2), **({"s": _i64(-100)} if run_time else {})}
    compare(run(build(model), feeds), onnxruntime_outputs(model, feeds))


def test_resize_to_sizes_read_at_run_time():
    model = graph_model([N("Resize", ["x", "", "", "v"], ["y"], mode="linear")],
                        {"x": ((1, 2, 3, 4), np.float32), "v": ((4,), np.int64)}, ["y"],
                        opset=13)
    model = _declare(model, {"y": (1, 2, 6, 7)})
    module = build(model)
    feeds = {"x": rand(RNG, 1, 2, 3, 4), "v": _i64(1, 2, 6, 7)}
    compare(run(module, feeds), onnxruntime_outputs(model, feeds))
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {**feeds, "v": _i64(1, 2, 6, 8)})


@pytest.mark.parametrize("case,match", [
    ("undeclared", (r"Reshape's shape is computed at run time and the output's shape is not "
                    r"known at import.*--const")),
    ("wrap", r"Pad \(node 'node', opset 19\): mode='wrap'"),
    ("scales", r"Resize's scales must be a constant"),
])
def test_sizes_read_at_run_time_are_refused_where_the_shape_is_not_static(case, match):
    if case == "undeclared":
        model = graph_model([N("Reshape", ["x", "v"], ["y"])],
                            {"x": ((3, 4), np.float32), "v": ((2,), np.int64)}, ["y"])
    elif case == "wrap":
        model = _declare(graph_model([N("Pad", ["x", "v"], ["y"], name="node", mode="wrap")],
                                     {"x": ((3, 4), np.float32), "v": ((4,), np.int64)}, ["y"],
                                     opset=19), {"y": (6, 5)})
    else:
        model = _declare(graph_model([N("Resize", ["x", "", "s"], ["y"])],
                                     {"x": ((1, 1, 2, 2), np.float32), "s": ((4,), np.float32)},
                                     ["y"], opset=13), {"y": (1, 1, 4, 4)})
    with pytest.raises(UnsupportedOperatorError, match=match):
        relay.frontend.from_onnx(model)


@pytest.mark.cross
def test_a_branch_a_loop_and_a_run_time_slice_on_an_emulated_board(tracker, tmp_path):  # noqa: F811
    """The sample-rate If decided on the board, a recurrence unrolled three times, and a
    window of it at a run-time start; a start whose window is cut short stops the run there."""
    net = _sample_rate_model()
    body = _graph("body", [N("MatMul", ["h", "u"], ["hu"]), N("Add", ["hu", "y"], ["h0"]),
                           N("Tanh", ["h0"], ["h1"]), N("Identity", ["c"], ["keep"])],
                  [("keep", bool), "h1"],
                  [_value("i", np.int64, []), _value("c", bool, []),
                   _value("h", np.float32, [3, 5])])
    net.graph.node.extend([N("Loop", ["three", "", "y"], ["z"], body=body),
                           N("Add", ["p", "three"], ["p_end"]),
                           N("Slice", ["z", "p", "p_end", "one"], ["window"])])
    net.graph.initializer.extend([onnx.numpy_helper.from_array(v, n) for n, v in (
        ("three", _i64(3)), ("one", _i64(1)), ("u", rand(RNG, 5, 5) * 0.3))])
    net.graph.input.append(_value("p", np.int64, [1]))
    net.graph.output[0].name = "window"
    model = _declare(onnx.shape_inference.infer_shapes(net, strict_mode=True), {"window": (3, 3)})
    feeds = [{**f, "p": _i64(p)} for f, p in zip(_rate_feeds(), (1, 2))]
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, "aarch64") as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        m = run_checked(remote, lib, tmp_path / "branch.so", feeds[0],
                        onnxruntime_outputs(model, feeds[0])[0], "aarch64")
        m.set_input(**feeds[1])
        m.run()
        compare([m.get_output(0).numpy()], onnxruntime_outputs(model, feeds[1]), 1e-4)
        m.set_input("p", _i64(3))
        with pytest.raises(RemoteError, match="out of bounds"):
            m.run()
