"""Model importers (TVM's ``relay.frontend``)."""
from .onnx import from_onnx, supported_operators

__all__ = ["from_onnx", "supported_operators"]
