"""What every ONNX converter shares: the converter table (each converter registered for the
opsets from which it implements its operator), a node's attributes (read by name, the unread
ones refused), the conversion context (a node made with its shape inferred, folded at once
when its inputs are constants), axis and reshape helpers."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from ..op import get as get_op

#: op_type -> {since opset: converter}
CONVERTERS: dict[str, dict] = {}


def converter(*op_types, since: int = 1):
    """Register the decorated function as the converter of ``op_types`` from opset ``since``
    on; a model of opset N is converted by the newest registration whose ``since`` <= N.
    Without ``since`` the converter covers every opset."""
    def register(fn):
        for op_type in op_types:
            versions = CONVERTERS.setdefault(op_type, {})
            if since in versions:
                raise ValueError(f"two converters of {op_type} since opset {since}")
            versions[since] = fn
        return fn
    return register


def find_converter(op_type: str, opset: int):
    """``(since, converter)`` of ``op_type`` in ``opset``, or None."""
    versions = [s for s in CONVERTERS.get(op_type, ()) if s <= opset]
    if not versions:
        return None
    since = max(versions)
    return since, CONVERTERS[op_type][since]


def supported_operators() -> list[str]:
    return sorted(CONVERTERS)


class Unsupported(ModelError):
    """Raised by a converter for an attribute value or input it does not implement."""


class UnknownValue(Unsupported):
    """A converter needed the value of a tensor that a refused node stands in for: not a
    refusal of its own (the refused node is reported)."""


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

    def ignore(self, *names):
        """Attributes without effect on inference (training-only, seeds...), accepted unread."""
        self._read.update(names)

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
        self.output_names: tuple = ()
        #: (output name) -> its (shape, dtype) when static by the model's value_info and ONNX's
        #: shape inference, else None
        self.inferred_type = None
        #: (GraphProto, what, bindings=None) -> its output values: a subgraph (an If's branch,
        #: a Loop's body) converted in a scope of its own, its nodes reading this graph's
        #: values and ``bindings`` (its inputs by name); ``what`` names it in refusals
        self.convert_graph = None

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

    def constant(self, node: ir.Node, what: str,
                 why: str = "computed from the input's values at run time is not supported"
                 ) -> np.ndarray:
        if node is not None and _depends_on_refused(node):
            raise UnknownValue(f"{what} comes from a refused node")
        if node is None or not node.is_const:
            raise Unsupported(f"{what} must be a constant ({why})")
        return node.value

    def known(self, node: ir.Node, what: str) -> np.ndarray | None:
        """``node``'s value when it is known at import, None when it is computed at run time."""
        if node.is_const:
            return node.value
        if _depends_on_refused(node):
            raise UnknownValue(f"{what} comes from a refused node")
        return None

    def static_output_shape(self, k: int, what: str) -> tuple:
        """The shape of the node's output ``k`` where ``what`` is read at run time: the model's
        (its value_info) or ONNX's shape inference's, which must be static; the kernel checks
        at run time that the values read give it."""
        found = self.inferred_type(self.output_names[k]) if k < len(self.output_names) else None
        if found is None or 0 in found[0]:
            raise Unsupported(f"{what} is computed at run time and the output's shape is not "
                              "known at import (neither the model's value_info nor ONNX's shape "
                              "inference gives it): fix the input it depends on with "
                              "from_onnx(..., const_inputs=...) or --const NAME=VALUE")
        return found[0]

    def optional(self, args, k: int, what: str) -> np.ndarray | None:
        """The constant value of optional input ``k``, None when the node leaves it out."""
        if len(args) <= k or args[k] is None:
            return None
        return self.constant(args[k], what)

    def optional_ints(self, args, k: int, what: str) -> list[int] | None:
        value = self.optional(args, k, what)
        return None if value is None else [int(v) for v in value.reshape(-1)]

    def optional_float(self, args, k: int, what: str, default: float | None) -> float | None:
        value = self.optional(args, k, what)
        if value is None:
            return default
        if value.size != 1:
            raise ModelError(f"{what} must be one value, got {value.size}")
        return float(value.reshape(()))


#: the op of the nodes that stand in for a refused node's outputs while the rest of the
#: graph is checked (never built: the import raises once every node has been seen)
STAND_IN = "refused"


def _depends_on_refused(node: ir.Node) -> bool:
    stack, seen = [node], set()
    while stack:
        node = stack.pop()
        if node.op == STAND_IN:
            return True
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(node.inputs)
    return False


def normalize_axis(axis: int, ndim: int, what="axis") -> int:
    if not -ndim <= axis < ndim:
        raise ModelError(f"{what} {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def reshape(ctx, x, shape):
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return ctx.make("reshape", [x], newshape=shape)
