"""ONNX models written in the tests, compiled for this host and compared with onnxruntime.

``check(nodes, inputs, ...)`` builds a model of ``nodes`` (its outputs' types by ONNX's shape
inference), runs it in onnxruntime and in kernelrpc, and compares every output: exactly for
integers and bools, within ``tol`` of the output's scale for floats."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

import kernelrpc
from kernelrpc import relay
from kernelrpc.contrib import graph_executor
from kernelrpc.relay.testing import onnxruntime_outputs

NEWEST_OPSET = onnx.defs.onnx_opset_version()
N = helper.make_node
RNG = np.random.default_rng(17)


def rand(*shape):
    """Seeded standard-normal float32 values."""
    return np.asarray(RNG.standard_normal(shape), np.float32)


def model_of(nodes, inputs: dict, outputs, inits: dict | None = None, opset=13):
    """``inputs``: name -> array (or (shape, dtype) for an input fed no value here)."""
    def info(name, value):
        shape, dtype = (value.shape, value.dtype) if hasattr(value, "shape") else value
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
            np.dtype(dtype)), shape)
    graph = helper.make_graph(
        nodes, "case", [info(n, v) for n, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset > 20 else 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(
        next(v for v in list(inferred.graph.value_info) + list(inferred.graph.output)
             if v.name == o) for o in outputs)
    return model


def build(model, **import_args):
    mod, params = relay.frontend.from_onnx(model, **import_args)
    lib = relay.build(mod, target="llvm", params=params)
    return graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))


def run(module, inputs: dict) -> list:
    module.set_input(**inputs)
    module.run()
    return [module.get_output(k).numpy() for k in range(module.get_num_outputs())]


def compare(got: list, expect: list, tol=1e-4):
    assert len(got) == len(expect)
    for k, (g, ref) in enumerate(zip(got, expect)):
        assert g.shape == ref.shape and g.dtype == ref.dtype, (k, g.shape, g.dtype, ref.shape,
                                                               ref.dtype)
        if ref.dtype.kind in "biu":
            np.testing.assert_array_equal(g, ref, err_msg=f"output {k}")
        else:
            scale = max(float(np.abs(ref[np.isfinite(ref)]).max(initial=0)), 1e-6)
            np.testing.assert_allclose(g, ref, rtol=0, atol=tol * scale, err_msg=f"output {k}")


def check(nodes, inputs: dict, outputs=("y",), inits=None, opset=13, tol=1e-4, **import_args):
    """The model run by kernelrpc agrees with onnxruntime; returns the built module."""
    model = model_of(nodes, inputs, outputs, inits, opset)
    module = build(model, **import_args)
    compare(run(module, inputs), onnxruntime_outputs(model, inputs), tol)
    return module
