"""ONNX's own backend test suite (``onnx.backend.test``) against kernelrpc, for the node tests
of every operator the importer supports. A case whose model kernelrpc refuses to compile (an
opset past 18, a dtype or attribute it does not implement) is skipped with the importer's
reason; a case that compiles must compute ONNX's expected outputs, or it fails."""
import re
import unittest

import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402

from kernelrpc.relay.errors import ModelError  # noqa: E402
from kernelrpc.relay.frontend.onnx import supported_operators  # noqa: E402
from kernelrpc.relay.onnx_backend import KernelrpcBackend  # noqa: E402


class Backend(KernelrpcBackend):
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        try:
            return super().prepare(model, device, **kwargs)
        except ModelError as exc:
            raise unittest.SkipTest(f"kernelrpc does not compile it: {exc}") from None


def _snake(op: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


backend_test = onnx.backend.test.BackendTest(Backend, __name__)
for op in supported_operators():
    backend_test.include(rf"^test_{_snake(op)}(_.*)?_cpu$")
# exporters' tests of other operators whose names start like ours
for other in ("reduce_log_sum", "reduce_sum_square", "reduce_l1", "reduce_l2",
              "concat_from_sequence", "split_to_sequence",
              "max_unpool", "max_roi_pool", "softmax_cross_entropy",
              "mean_variance"):
    backend_test.exclude(rf"^test_{other}")

globals().update(backend_test.test_cases)
