"""ONNX's own backend node tests (``onnx.backend.test``) of the quantization operators, whose
test names are not their snake-cased operator names (``test_dequantizelinear``,
``test_qlinearconv``...). A case kernelrpc refuses (a float8, int4 or int16 type, blocked
quantization, an opset past 18) is skipped with the importer's reason; a case that compiles
must compute ONNX's expected outputs."""
import pytest

pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402
from test_onnx_backend_suite import Backend  # noqa: E402

backend_test = onnx.backend.test.BackendTest(Backend, __name__)
for name in ("quantizelinear", "dequantizelinear", "dynamicquantizelinear", "qlinearconv",
             "qlinearmatmul", "convinteger", "matmulinteger"):
    backend_test.include(rf"^test_{name}(_.*)?_cpu$")
# the expanded forms test other operators (Cast, Round, Clip on 0-d tensors)
backend_test.exclude(r"_expanded_cpu$")

globals().update(backend_test.test_cases)
