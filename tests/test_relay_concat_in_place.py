"""Concatenations written in place: where each input is one contiguous, aligned slice of the
output and written by a kernel for the concatenation alone, the producers write their slices
of the output and the concatenation runs no kernel; elsewhere it stays a copy. Either way the
network computes the concatenation."""
import json

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.contrib.debugger import debug_executor  # noqa: E402

RNG = np.random.default_rng(7)


def branches_model(batch=1, channels=(16, 16), side=4, shared=False, concat_is_output=False):
    """x -> a 1x1 convolution per branch -> Concat(axis 1) -> a 1x1 convolution; ``shared``:
    the first branch's Relu is a second output; ``concat_is_output``: the concatenation is
    the graph's output. Returns the model, its input and numpy's outputs."""
    cin, cout = 8, 4
    x = RNG.standard_normal((batch, cin, side, side)).astype("float32")
    weights = [RNG.standard_normal((c, cin, 1, 1)).astype("float32") for c in channels]
    last = RNG.standard_normal((cout, sum(channels), 1, 1)).astype("float32")
    inits = [numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)]
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"b{k}"]) for k in range(len(weights))]
    branches = [np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) for w in weights]
    joined = np.concatenate(branches, axis=1)
    nodes.append(helper.make_node("Concat", [f"b{k}" for k in range(len(weights))],
                                  ["y" if concat_is_output else "cat"], axis=1))
    outputs = [joined]
    if not concat_is_output:
        inits.append(numpy_helper.from_array(last, "wl"))
        nodes.append(helper.make_node("Conv", ["cat", "wl"], ["y"]))
        outputs = [np.einsum("nchw,oc->nohw", joined, last[:, :, 0, 0])]
    if shared:
        nodes.append(helper.make_node("Relu", ["b0"], ["z"]))
        outputs.append(np.maximum(branches[0], 0))
    graph = helper.make_graph(
        nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, out.shape)
         for name, out in zip("yz", outputs)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, x, outputs


def build_and_run(model, x):
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    module.set_input("x", x)
    module.run()
    return lib, [module.get_output(k).numpy() for k in range(module.get_num_outputs())]


def copies(lib) -> int:
    return sum("concatenate" in record["kind"] for record in lib.executor["kernels"])


def test_branches_write_their_slices_of_the_concatenation():
    model, x, expect = branches_model()
    lib, outs = build_and_run(model, x)
    np.testing.assert_allclose(outs[0], expect[0], rtol=1e-4, atol=1e-4)
    assert copies(lib) == 0
    graph = json.loads(lib.get_graph_json())
    assert [n["attrs"]["func_name"] for n in graph["nodes"] if n["op"] == "tvm_op"].count(
        "__nop") == 1
    dbg = debug_executor.create(lib.get_graph_json(), lib, kernelrpc.cpu(0))
    dbg.set_input("x", x)
    assert len(dbg.run_individual(number=1)) == len(lib.executor["kernels"])


@pytest.mark.parametrize("case", [
    dict(batch=2),                       # each input is two runs of the output, not one
    dict(channels=(3, 16), side=5),      # the second slice would start off a 64-byte line
    dict(shared=True),                   # the first branch is read by another layer too
    dict(concat_is_output=True),         # the caller's output tensor, not the arena
])
def test_concatenations_that_cannot_be_written_in_place_copy(case):
    model, x, expect = branches_model(**case)
    lib, outs = build_and_run(model, x)
    assert len(outs) == len(expect)
    for out, want in zip(outs, expect):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    assert copies(lib) == 1
