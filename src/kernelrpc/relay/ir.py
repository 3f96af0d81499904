"""The network graph: a dataflow graph of operator nodes with static shapes and dtypes.

It is what ``relay.frontend.from_onnx`` returns (inside an :class:`IRModule`) and what
``relay.build`` compiles. Every node has one output. Graph inputs are ``input`` nodes,
weights are ``param`` nodes (their values travel beside the module, as TVM's ``params``) or,
once bound, ``const`` nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ModelError

#: the element types a network's tensors may have (an imported network has float16 tensors
#: only at its boundary: inputs and outputs cast to and from the float32 it computes in)
DTYPES = ("float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8", "bool")


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple
    attrs: dict
    shape: tuple
    dtype: str
    name: str = ""
    value: np.ndarray | None = None      # const nodes only
    origin: tuple = ()                   # the ONNX operator types this node stands for

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __repr__(self) -> str:
        return f"<{self.op} {self.name!r} {list(self.shape)} {self.dtype}>"


def const(value, name: str = "") -> Node:
    value = np.require(value, requirements="C")     # ascontiguousarray makes 0-d arrays 1-d
    if value.dtype.name not in DTYPES:
        raise ModelError(f"constant {name!r}: dtype {value.dtype} is not supported "
                         f"(supported: {', '.join(DTYPES)})")
    return Node("const", (), {}, tuple(int(d) for d in value.shape), value.dtype.name, name, value)


@dataclass(eq=False)
class Function:
    """A network: its input nodes (in order), output nodes, and every node in between."""

    inputs: list
    outputs: list
    name: str = "main"

    def topo(self) -> list:
        """The inputs, then every node reachable from the outputs, producers before consumers."""
        order, seen = list(self.inputs), {id(i) for i in self.inputs}
        for out in self.outputs:
            stack = [(out, False)]
            while stack:
                node, done = stack.pop()
                if done:
                    order.append(node)
                    continue
                if id(node) in seen:
                    continue
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
        return order

    def astext(self) -> str:
        names, lines = {}, []
        for node in self.topo():
            if node.op in ("input", "param"):
                names[id(node)] = "%" + (node.name or f"x{len(names)}")
                continue
            if node.op == "const":
                names[id(node)] = f"meta[const][{len(names)}]{list(node.shape)}"
                continue
            names[id(node)] = f"%{len(lines)}"
            args = ", ".join(names[id(i)] for i in node.inputs)
            attrs = ", ".join(f"{k}={v}" for k, v in node.attrs.items())
            lines.append(f"  {names[id(node)]} = {node.op}({args}{', ' if attrs else ''}{attrs})"
                         f"  /* {list(node.shape)} {node.dtype} */")
        head = ", ".join(f"{names[id(i)]}: Tensor[{list(i.shape)}, {i.dtype}]" for i in self.inputs)
        outs = ", ".join(names[id(o)] for o in self.outputs)
        return f"def @{self.name}({head}) {{\n" + "\n".join(lines) + f"\n  ({outs})\n}}"

    def __str__(self) -> str:
        return self.astext()


class IRModule:
    """TVM's ``IRModule`` for one network: ``mod["main"]`` is the :class:`Function`."""

    def __init__(self, main: Function):
        self.functions = {"main": main}

    def __getitem__(self, name: str) -> Function:
        return self.functions[name]

    def astext(self) -> str:
        return self["main"].astext()

    def __str__(self) -> str:
        return self.astext()
