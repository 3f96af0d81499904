"""The operator table: for each operator of the graph, its shape rule, its tensor expression,
its numpy form (for constant folding) and its fusion pattern.

Patterns, as TVM's: ``elemwise`` (one output element from the same element of each input),
``broadcast`` (elemwise with numpy broadcasting), ``injective`` (each output element a function
of input elements: reshape, transpose, pad...), ``anchor`` (conv, dense, pooling, reductions:
an elementwise tail fuses into it), ``opaque`` (runs alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...compiler import expr as E
from ..errors import ModelError

PATTERNS = ("elemwise", "broadcast", "injective", "anchor", "opaque")


@dataclass(frozen=True)
class OpDef:
    name: str
    pattern: str
    infer: Callable            # (inputs: list[Node], attrs) -> (shape, dtype)
    compute: Callable          # (tensors: list[te.Tensor], attrs, node) -> te.Tensor
    fold: Callable | None = None     # (arrays: list[np.ndarray], attrs) -> np.ndarray
    flops: Callable | None = None    # (node) -> int (multiply-adds count as 2)
    #: it reads at indices computed from tensor values (a gather): its kernel is built with
    #: run-time bound checks, so that an index out of range stops the run with a KernelError
    checked: bool = False


OPS: dict[str, OpDef] = {}


def register(name: str, pattern: str, infer, compute, fold=None, flops=None,
             checked=False) -> OpDef:
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}")
    op = OPS[name] = OpDef(name, pattern, infer, compute, fold, flops, checked)
    return op


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise ModelError(f"no operator {name!r} in kernelrpc's operator table") from None


def static_shape(tensor) -> list[int]:
    """A tensor expression's static shape as ints."""
    return [int(d.value) if hasattr(d, "value") else int(d) for d in tensor.shape]


def unravel(flat, dims) -> list:
    """The index of element ``flat`` of a row-major array of shape ``dims`` (the first
    dimension's index unbounded): the flattened index of several axes taken apart."""
    index = []
    for extent in reversed(list(dims)[1:]):
        index.append(E.floormod(flat, extent))
        flat = E.floordiv(flat, extent)
    return [flat, *reversed(index)]


def node_flops(node) -> int:
    op = OPS.get(node.op)
    if op is None or op.flops is None:
        return node.size if op is not None and op.pattern in ("elemwise", "broadcast") else 0
    return int(op.flops(node))
