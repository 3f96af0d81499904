"""Whole networks (TVM's ``tvm.relay``): import a model, build it for a target, run it with
:mod:`kernelrpc.contrib.graph_executor`.

    mod, params = relay.frontend.from_onnx(onnx.load("net.onnx"), shape={"input": (1, 3, 224, 224)})
    lib = relay.build(mod, target="llvm", params=params)
    lib.export_library("net.so")
"""
from . import frontend, op, transform
from .build_module import GraphExecutorFactoryModule, build
from .errors import InputError, MissingShapeError, ModelError, UnsupportedOperatorError
from .ir import Function, IRModule, Node

__all__ = ["Function", "GraphExecutorFactoryModule", "IRModule", "InputError",
           "MissingShapeError", "ModelError", "Node", "UnsupportedOperatorError", "build",
           "frontend", "op", "transform"]
