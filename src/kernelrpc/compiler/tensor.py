"""Tensors and the operations that define them: placeholders, compute ops, reductions."""
from __future__ import annotations

import inspect

from .expr import (Add, DTypeError, IntImm, Max, Min, PrimExpr, Var, _as_bool, const, convert,
                   max_value, min_value)


class TensorError(ValueError):
    """A tensor expression is malformed (wrong arity, bad shape, misplaced reduction)."""


class Range:
    """``[min, min + extent)``, as TVM's ``axis.dom``."""

    def __init__(self, min_value, extent):
        self.min = min_value
        self.extent = extent

    def __repr__(self):
        return f"range(min={self.min!r}, ext={self.extent!r})"


class IterVar:
    """An iteration axis: a Var with a domain ``[min, min+extent)`` and a kind.

    Usable directly inside expressions (it stands for its ``var``).
    """

    DATA_PAR = "data_par"
    REDUCE = "reduce"

    def __init__(self, dom_min, extent, var: Var, kind: str = DATA_PAR):
        self.dom_min = convert(dom_min)
        self.extent = convert(extent)
        self.var = var
        self.kind = kind

    @property
    def name(self) -> str:
        return self.var.name

    @property
    def dom(self) -> "Range":
        return Range(self.dom_min, self.extent)

    @property
    def dtype(self) -> str:
        return self.var.dtype

    def __repr__(self):
        return f"IterVar({self.var.name}, [{self.dom_min!r}, {self.extent!r}), {self.kind})"

    __hash__ = object.__hash__


def _delegate(name):
    def method(self, *args):
        return getattr(self.var, name)(*args)
    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
              "__rmod__", "__neg__", "__lt__", "__le__", "__gt__", "__ge__", "astype"):
    setattr(IterVar, _name, _delegate(_name))


class TensorLoad(PrimExpr):
    """``tensor[indices]`` inside a tensor expression (TVM's ProducerLoad)."""

    __slots__ = ("tensor", "indices")
    _fields = ("tensor", "indices")

    def __init__(self, tensor: "Tensor", indices):
        self.tensor = tensor
        self.indices = tuple(indices)
        self.dtype = tensor.dtype

    def to_str(self, printer) -> str:
        return f"{self.tensor.name}[{', '.join(printer.expr(i) for i in self.indices)}]"


REDUCERS = {
    "sum": (lambda a, b: Add(a, b), lambda dtype: const(0, dtype)),
    "max": (lambda a, b: Max(a, b), min_value),
    "min": (lambda a, b: Min(a, b), max_value),
}


class Reduce(PrimExpr):
    """A commutative reduction of ``source`` over ``axis``; only at the top of a compute body."""

    __slots__ = ("combiner", "source", "axis", "condition")
    _fields = ("combiner", "source", "axis", "condition")

    def __init__(self, combiner: str, source: PrimExpr, axis, condition: PrimExpr | None = None):
        self.combiner = combiner
        self.source = source
        self.axis = tuple(axis)
        self.condition = condition
        self.dtype = source.dtype

    def identity(self) -> PrimExpr:
        return REDUCERS[self.combiner][1](self.dtype)

    def combine(self, acc: PrimExpr, value: PrimExpr) -> PrimExpr:
        return REDUCERS[self.combiner][0](acc, value)

    def to_str(self, printer) -> str:
        axes = ", ".join(printer.var(a.var) for a in self.axis)
        cond = "" if self.condition is None else f", where={printer.expr(self.condition)}"
        return f"{self.combiner}({printer.expr(self.source)}, axis=[{axes}]{cond})"


class Operation:
    name: str

    def output(self, index: int = 0) -> "Tensor":
        return self.outputs[index]

    @property
    def input_tensors(self) -> list:
        return []


class PlaceholderOp(Operation):
    def __init__(self, name: str, shape, dtype: str):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.outputs = [Tensor(shape, dtype, self, name)]

    def __repr__(self):
        return f"placeholder({self.name})"


class ComputeOp(Operation):
    def __init__(self, name: str, axis, body: PrimExpr, tag: str = "", attrs=None):
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.axis = list(axis)
        self.body = body
        self.reduce_axis = list(body.axis) if isinstance(body, Reduce) else []
        shape = tuple(iv.extent for iv in self.axis)
        self.outputs = [Tensor(shape, body.dtype, self, name)]

    @property
    def input_tensors(self) -> list:
        from .ir import post_order_visit
        found: list = []

        def fn(node):
            if isinstance(node, TensorLoad) and all(t is not node.tensor for t in found):
                found.append(node.tensor)
        post_order_visit(self.body, fn)
        return found

    def __repr__(self):
        return f"compute({self.name})"


class Tensor:
    def __init__(self, shape, dtype: str, op: Operation, name: str):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.op = op
        self.name = name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices) -> TensorLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise TensorError(f"{self.name} has {len(self.shape)} dimensions, "
                              f"indexed with {len(indices)}")
        conv = []
        for i in indices:
            e = convert(i)
            if e.dtype not in ("int32", "int64"):
                raise DTypeError(f"index of {self.name} must be an integer, got {e.dtype}")
            conv.append(e)
        return TensorLoad(self, conv)

    def __call__(self, *indices) -> TensorLoad:
        return self[indices]

    def __repr__(self):
        return f"Tensor({self.name}, shape={list(self.shape)}, {self.dtype})"

    __hash__ = object.__hash__


def _shape(shape) -> tuple:
    if isinstance(shape, (int, PrimExpr)):
        shape = (shape,)
    out = []
    for d in shape:
        if isinstance(d, float) and d.is_integer():
            d = int(d)              # the tutorial writes N / bn
        e = convert(d)
        if e.dtype not in ("int32", "int64"):
            raise TensorError(f"shape entries must be integers, got {e.dtype}")
        if isinstance(e, IntImm) and e.value < 0:
            raise TensorError(f"negative extent {e.value} in shape")
        out.append(e)
    return tuple(out)


def placeholder(shape, name: str = "placeholder", dtype: str = "float32") -> Tensor:
    from .expr import parse_dtype
    parse_dtype(dtype)
    return PlaceholderOp(name, _shape(shape), dtype).output(0)


def var(name: str = "tindex", dtype: str = "int32") -> Var:
    return Var(name, dtype)


def compute(shape, fcompute, name: str = "compute", tag: str = "", attrs=None) -> Tensor:
    """``te.compute(shape, lambda i, j: ..., name)``; axis names come from the lambda."""
    shape = _shape(shape)
    params = list(inspect.signature(fcompute).parameters.values())
    if len(params) == 1 and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        names = [f"i{k}" for k in range(len(shape))]
    else:
        names = [p.name for p in params]
        if len(names) != len(shape):
            raise TensorError(f"fcompute takes {len(names)} arguments, shape has {len(shape)}")
    axis = [IterVar(0, ext, Var(n)) for n, ext in zip(names, shape)]
    body = convert(fcompute(*[iv.var for iv in axis]))
    _check_reduce_at_top(body)
    return ComputeOp(name, axis, body, tag, attrs).output(0)


def _check_reduce_at_top(body: PrimExpr) -> None:
    from .ir import post_order_visit

    def fn(node):
        if isinstance(node, Reduce) and node is not body:
            raise TensorError("a reduction (te.sum/max/min) must be the whole compute body")
    post_order_visit(body.source if isinstance(body, Reduce) else body, fn)


def reduce_axis(dom, name: str = "rv") -> IterVar:
    lo, hi = dom
    both_int = isinstance(lo, int) and isinstance(hi, int)
    extent = hi - lo if both_int else convert(hi) - convert(lo)
    return IterVar(lo, extent, Var(name), IterVar.REDUCE)


def _reducer(combiner: str, binary):
    def reducer(expr, axis=None, where=None, *rest):
        if axis is None or isinstance(axis, (PrimExpr, int, float)):
            # elementwise form: te.max(a, b, ...)
            values = [expr] + ([] if axis is None else [axis]) + list(rest)
            if where is not None:
                values.append(where)
            out = convert(values[0])
            for v in values[1:]:
                out = binary(out, v)
            return out
        axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != IterVar.REDUCE:
                raise TensorError(f"{combiner}: axis must be te.reduce_axis, got {a!r}")
        cond = None if where is None else _as_bool(where)
        return Reduce(combiner, convert(expr), axes, cond)
    reducer.__name__ = combiner
    return reducer


def _max2(a, b):
    from .expr import maximum
    return maximum(a, b)


def _min2(a, b):
    from .expr import minimum
    return minimum(a, b)


sum = _reducer("sum", lambda a, b: convert(a) + b)  # noqa: A001 - TVM's name
max = _reducer("max", _max2)  # noqa: A001
min = _reducer("min", _min2)  # noqa: A001
