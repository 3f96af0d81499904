"""One-node ONNX models compiled by kernelrpc and run beside onnxruntime (the operator tests of
tests/test_onnx_*.py): seeded inputs, weights as initializers, every output compared within
``tol`` of its scale."""
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


def import_model(model):
    """``from_onnx``; a model past opset 18 that the importer's version gate refuses is
    skipped (the converters read ``ctx.opset``; the gate is the registry's)."""
    try:
        return relay.frontend.from_onnx(model)
    except UnsupportedOperatorError as exc:
        if model.opset_import[0].version > MAX_OPSET and "newer than opset" in str(exc):
            pytest.skip(f"the importer refuses opset {model.opset_import[0].version}: {exc}")
        raise


def one_node_model(op_type, inputs: dict, attrs=None, inits=None, opset=13, outputs=1):
    inits = inits or {}
    out_names = [f"y{k}" for k in range(outputs)]
    node = helper.make_node(op_type, list(inputs) + list(inits), out_names, name="node",
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in inputs.items()],
        [helper.make_value_info(o, onnx.TypeProto()) for o in out_names],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = _ir_version(opset)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def kernelrpc_outputs(model, inputs: dict) -> list:
    """``model`` imported, built for the host and run once on ``inputs``."""
    mod, params = import_model(model)
    lib = relay.build(mod, target="llvm", params=params)
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**inputs)
    m.run()
    return [m.get_output(k).numpy() for k in range(m.get_num_outputs())]


def run_model(model, inputs: dict, tol=1e-5):
    """kernelrpc's outputs of ``model`` checked against onnxruntime's; returns kernelrpc's."""
    expect = onnxruntime_outputs(model, inputs)
    got_all = kernelrpc_outputs(model, inputs)
    assert len(got_all) == len(expect)
    for got, ref in zip(got_all, expect):
        assert got.shape == ref.shape, (got.shape, ref.shape)
        assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
        scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-6)
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale)
        else:
            np.testing.assert_array_equal(got, ref)
    return got_all


def check(op_type, inputs: dict, attrs=None, inits=None, opset=13, outputs=1, tol=1e-5):
    return run_model(one_node_model(op_type, inputs, attrs, inits, opset, outputs), inputs, tol)
