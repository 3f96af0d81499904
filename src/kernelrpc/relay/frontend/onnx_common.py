"""What every ONNX converter shares: the converter table, a node's attributes (read by
name, the unread ones refused), the conversion context (a node made with its shape inferred,
folded at once when its inputs are constants), axis and reshape helpers."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from ..op import get as get_op

CONVERTERS: dict = {}


def converter(*op_types):
    def register(fn):
        for op_type in op_types:
            CONVERTERS[op_type] = fn
        return fn
    return register


def supported_operators() -> list[str]:
    return sorted(CONVERTERS)


class Unsupported(ModelError):
    """Raised by a converter for an attribute value or input it does not implement."""


class Attrs:
    """A node's attributes, read by name; ``done()`` refuses the ones nobody read."""

    def __init__(self, node):
        from onnx import helper

        self._values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self._read = set()

    def get(self, name, default=None):
        self._read.add(name)
        value = self._values.get(name, default)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value

    def ints(self, name, default):
        value = self.get(name, default)
        return [int(v) for v in value] if value is not None else None

    def done(self):
        extra = sorted(map(str, set(self._values) - self._read))
        if extra:
            raise Unsupported(f"attribute(s) {', '.join(map(str, extra))} not implemented")


class Context:
    def __init__(self, opset: int):
        self.opset = opset
        self.values: dict = {}
        self.node_name = ""
        self.op_type = ""
        self.outputs_wanted = 1

    def make(self, op: str, inputs, **attrs) -> ir.Node:
        """A node of ``op`` (shape and dtype inferred); evaluated now when its inputs are all
        constants and the operator has a numpy form."""
        inputs = tuple(inputs)
        opdef = get_op(op)
        shape, dtype = opdef.infer(list(inputs), attrs)
        if all(i.is_const for i in inputs) and opdef.fold is not None:
            value = np.asarray(opdef.fold([i.value for i in inputs], attrs))
            if value.shape != tuple(shape):
                raise ModelError(f"{op}: folded value has shape {value.shape}, expected {shape}")
            return ir.const(value.astype(dtype, copy=False), self.node_name)
        return ir.Node(op, inputs, attrs, tuple(int(d) for d in shape), dtype, self.node_name,
                       origin=(self.op_type,))

    def constant(self, node: ir.Node, what: str) -> np.ndarray:
        if node is None or not node.is_const:
            raise Unsupported(f"{what} must be a constant (computed from the input's values at "
                              "run time is not supported)")
        return node.value



def normalize_axis(axis: int, ndim: int, what="axis") -> int:
    if not -ndim <= axis < ndim:
        raise ModelError(f"{what} {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def reshape(ctx, x, shape):
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return ctx.make("reshape", [x], newshape=shape)

