"""ONNX models written in the tests (one node, or a graph of nodes) compiled by kernelrpc and
run beside onnxruntime (the operator tests of tests/test_onnx_*.py): seeded inputs, weights
as initializers, every output compared within ``tol`` of its scale (integers and bools
exactly)."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import kernelrpc
from kernelrpc import relay
from kernelrpc.contrib import graph_executor
from kernelrpc.relay.errors import UnsupportedOperatorError
from kernelrpc.relay.frontend.onnx_model import MAX_OPSET
from kernelrpc.relay.testing import onnxruntime_outputs

NEWEST_OPSET = onnx.defs.onnx_opset_version()
N = helper.make_node


def opsets(op_type) -> list[int]:
    """The opsets from 9 to the newest at which ``op_type``'s definition changes (each
    version's first opset, 9 for those older), and the newest."""
    found = set()
    for opset in range(9, NEWEST_OPSET + 1):
        try:
            found.add(max(onnx.defs.get_schema(op_type, opset).since_version, 9))
        except onnx.defs.SchemaError:
            continue
    return sorted(found | {NEWEST_OPSET})


def rand(rng, *shape, positive=False):
    value = np.asarray(rng.standard_normal(shape), np.float32)
    return np.asarray(np.abs(value) + 0.5, np.float32) if positive else value


def _ir_version(opset: int) -> int:
    return 8 if opset <= 18 else 9 if opset <= 20 else 10


def import_model(model, **import_args):
    """``from_onnx``; a model past opset 18 that the importer's version gate refuses is
    skipped (the converters read ``ctx.opset``; the gate is the registry's)."""
    try:
        return relay.frontend.from_onnx(model, **import_args)
    except UnsupportedOperatorError as exc:
        if model.opset_import[0].version > MAX_OPSET and "newer than opset" in str(exc):
            pytest.skip(f"the importer refuses opset {model.opset_import[0].version}: {exc}")
        raise


def graph_model(nodes, inputs: dict, outputs, inits=None, opset=13):
    """A model of ``nodes``; ``inputs``: name -> array, or ``(shape, dtype)`` for an input fed
    no value here; the outputs' types by ONNX's shape inference."""
    def info(name, value):
        shape, dtype = (value.shape, value.dtype) if hasattr(value, "shape") else value
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            np.dtype(dtype)), shape)
    graph = helper.make_graph(
        nodes, "case", [info(n, v) for n, v in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def one_node_model(op_type, inputs: dict, attrs=None, inits=None, opset=13, outputs=1):
    inits = inits or {}
    out_names = [f"y{k}" for k in range(outputs)]
    node = N(op_type, list(inputs) + list(inits), out_names, name="node", **(attrs or {}))
    return graph_model([node], inputs, out_names, inits, opset)


def build(model, **import_args):
    """``model`` imported (``from_onnx``'s keywords) and built for the host, ready to run."""
    mod, params = import_model(model, **import_args)
    lib = relay.build(mod, target="llvm", params=params)
    return graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))


def run(module, inputs: dict) -> list:
    module.set_input(**inputs)
    module.run()
    return [module.get_output(k).numpy() for k in range(module.get_num_outputs())]


def kernelrpc_outputs(model, inputs: dict) -> list:
    """``model`` imported, built for the host and run once on ``inputs``."""
    return run(build(model), inputs)


def compare(got_all, expect, tol=1e-5):
    assert len(got_all) == len(expect)
    for got, ref in zip(got_all, expect):
        assert got.shape == ref.shape, (got.shape, ref.shape)
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
        scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-6)
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale)
        else:
            np.testing.assert_array_equal(got, ref)


def run_model(model, inputs: dict, tol=1e-5, **import_args):
    """kernelrpc's outputs of ``model`` checked against onnxruntime's; returns kernelrpc's."""
    got_all = run(build(model, **import_args), inputs)
    compare(got_all, onnxruntime_outputs(model, inputs), tol)
    return got_all


def check(op_type, inputs: dict, attrs=None, inits=None, opset=13, outputs=1, tol=1e-5):
    return run_model(one_node_model(op_type, inputs, attrs, inits, opset, outputs), inputs, tol)


def check_graph(nodes, inputs: dict, outputs=("y",), inits=None, opset=13, tol=1e-5):
    return run_model(graph_model(nodes, inputs, outputs, inits, opset), inputs, tol)
