"""ONNX's own backend node test suite (``onnx.backend.test``) against kernelrpc, whole: no list
of operators. A case whose model kernelrpc refuses to compile (an operator, a dtype or an
attribute it does not implement, an opset past what it reads) is skipped with the importer's
reason; a case that compiles must compute ONNX's expected outputs, or it fails."""
import unittest

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402

from kernelrpc.relay.errors import ModelError  # noqa: E402
from kernelrpc.relay.onnx_backend import KernelrpcBackend  # noqa: E402


class Backend(KernelrpcBackend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        try:
            return super().prepare(model, device, **kwargs)
        except ModelError as exc:
            raise unittest.SkipTest(f"kernelrpc does not compile it: {exc}") from None


backend_test = onnx.backend.test.BackendTest(Backend, __name__)
backend_test.include(r"^test_.*_cpu$")

globals()["OnnxBackendNodeModelTest"] = backend_test.test_cases["OnnxBackendNodeModelTest"]
