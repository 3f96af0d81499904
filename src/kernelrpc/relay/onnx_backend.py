"""ONNX's backend interface (``onnx.backend.base.Backend``) over kernelrpc, so that ONNX's own
backend test suite (``onnx.backend.test``) runs against it:

    from kernelrpc.relay.onnx_backend import KernelrpcBackend
    outputs = KernelrpcBackend.prepare(model).run([x])

``prepare`` imports and builds the model for this host; a model kernelrpc cannot compile
raises the importer's typed error (``UnsupportedOperatorError``...).
"""
from __future__ import annotations

import numpy as np
from onnx.backend.base import Backend, BackendRep

from .. import runtime
from ..contrib.graph_executor import GraphModule
from .build_module import build
from .frontend import from_onnx


class KernelrpcRep(BackendRep):
    def __init__(self, lib):
        self.lib = lib
        self.module = GraphModule(lib["default"](runtime.cpu(0)))
        self.input_names = self.module.module.input_names

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            items = inputs.items()
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            if len(inputs) != len(self.input_names):
                raise ValueError(f"the model has {len(self.input_names)} inputs, "
                                 f"{len(inputs)} given")
            items = zip(self.input_names, inputs)
        for name, value in items:
            self.module.set_input(name, np.require(value, requirements="C"))
        self.module.run()
        return tuple(self.module.get_output(k).numpy()
                     for k in range(self.module.get_num_outputs()))


class KernelrpcBackend(Backend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> KernelrpcRep:
        super().prepare(model, device, **kwargs)
        mod, params = from_onnx(model)
        return KernelrpcRep(build(mod, target="llvm", params=params))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = KernelrpcBackend.prepare
supports_device = KernelrpcBackend.supports_device
