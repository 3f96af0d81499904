"""Errors of model import and network build: each names the model's node and the fix."""
from __future__ import annotations

from ..errors import GraphInputError


class ModelError(ValueError):
    """The model cannot be imported or built as given (malformed, inconsistent, too large)."""


class UnsupportedOperatorError(ModelError):
    """The model uses operators (or attribute values) that kernelrpc does not implement.

    ``unsupported`` lists every one found, each ``(op_type, node_name, opset, why)``, so that a
    single import reports all of them before any build work starts.
    """

    def __init__(self, unsupported: list):
        self.unsupported = list(unsupported)
        lines = [f"  {op} (node {name!r}, opset {opset}){': ' + why if why else ''}"
                 for op, name, opset, why in self.unsupported]
        super().__init__(f"the model uses {len(self.unsupported)} operator(s) kernelrpc cannot "
                         "compile:\n" + "\n".join(lines))


class MissingShapeError(ModelError):
    """An input has a dynamic dimension and no shape was given for it."""


InputError = GraphInputError
