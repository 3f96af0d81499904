"""Tensors and the operations that define them: placeholders, compute ops, reductions."""
from __future__ import annotations

import inspect

from .expr import (DTypeError, IntImm, PrimExpr, Var, _as_bool, const, convert, max_value,
                   min_value, node)


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


@node
class TensorLoad(PrimExpr):
    """``tensor[indices]`` inside a tensor expression (TVM's ProducerLoad)."""

    _fields = ("tensor", "indices")
    _tuples = ("indices",)
    _dtype_of = "tensor"

    def to_str(self, printer) -> str:
        return f"{self.tensor.name}[{', '.join(printer.expr(i) for i in self.indices)}]"


class CommReducer:
    """A commutative reducer (TVM's ``te.comm_reducer``): ``fcombine(x, y)`` and the identity.

    For a tuple reducer (argmax: ``(index, value)``) ``fcombine`` takes and returns tuples
    and ``fidentity(*dtypes)`` returns one identity per element; for a single value they take
    and return single expressions.
    """

    def __init__(self, fcombine, fidentity, name: str = "reduce"):
        self.fcombine = fcombine
        self.fidentity = fidentity
        self.name = name

    def combine(self, accs: tuple, values: tuple) -> tuple:
        if len(accs) == 1:
            return (convert(self.fcombine(accs[0], values[0])),)
        out = self.fcombine(tuple(accs), tuple(values))
        if not isinstance(out, (tuple, list)) or len(out) != len(accs):
            raise TensorError(f"{self.name}: fcombine must return {len(accs)} values")
        return tuple(convert(o) for o in out)

    def identity(self, dtypes) -> tuple:
        out = self.fidentity(*dtypes)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(dtypes):
            raise TensorError(f"{self.name}: fidentity must return {len(dtypes)} values")
        return tuple(const(o, d) if not isinstance(o, PrimExpr) else o.astype(d)
                     for o, d in zip(out, dtypes))

    def __call__(self, expr, axis=None, where=None, init=None, *rest):
        return _reduce(self, expr, axis, where, init, rest)

    def __repr__(self):
        return f"comm_reducer({self.name})"


def comm_reducer(fcombine, fidentity, name: str = "reduce") -> CommReducer:
    return CommReducer(fcombine, fidentity, name)


@node
class Reduce(PrimExpr):
    """Element ``value_index`` of a commutative reduction of ``source`` (a tuple) over ``axis``.

    Only at the top of a compute body; a tuple reduction's outputs share combiner, source,
    axes, condition and init.
    """

    _fields = ("combiner", "source", "axis", "condition", "value_index", "init")

    def __init__(self, combiner: CommReducer, source, axis, condition: PrimExpr | None = None,
                 value_index: int = 0, init=None):
        self.combiner = combiner
        self.source = tuple(source)
        self.axis = tuple(axis)
        self.condition = condition
        self.value_index = value_index
        self.init = None if init is None else tuple(init)
        self.dtype = self.source[value_index].dtype

    def identity(self) -> tuple:
        return self.combiner.identity([s.dtype for s in self.source])

    def to_str(self, printer) -> str:
        axes = ", ".join(printer.var(a.var) for a in self.axis)
        cond = "" if self.condition is None else f", where={printer.expr(self.condition)}"
        src = ", ".join(printer.expr(x) for x in self.source)
        index = f"[{self.value_index}]" if len(self.source) > 1 else ""
        init = "" if self.init is None else \
            f", init={', '.join(printer.expr(x) for x in self.init)}"
        return f"{self.combiner.name}({src}, axis=[{axes}]{cond}{init}){index}"


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
    """``te.compute``: one body per output (several when the lambda returns a tuple)."""

    def __init__(self, name: str, axis, body, tag: str = "", attrs=None):
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.axis = list(axis)
        self.bodies = tuple(body) if isinstance(body, (tuple, list)) else (body,)
        first = self.bodies[0]
        self.reduce_axis = list(first.axis) if isinstance(first, Reduce) else []
        shape = tuple(iv.extent for iv in self.axis)
        self.outputs = [Tensor(shape, b.dtype, self, name if len(self.bodies) == 1
                               else f"{name}.v{k}", k) for k, b in enumerate(self.bodies)]

    @property
    def body(self):
        """The body of a single-output op (TVM's ``op.body[0]``)."""
        return self.bodies[0]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def input_tensors(self) -> list:
        from .ir import post_order_visit
        found: list = []

        def fn(node):
            if isinstance(node, TensorLoad) and all(t is not node.tensor for t in found):
                found.append(node.tensor)
        for body in self.bodies:
            post_order_visit(body, fn)
        return found

    def __repr__(self):
        return f"compute({self.name})"


class ExternOp(Operation):
    """``te.extern``: outputs computed by a statement ``fcompute(in_buffers, out_buffers)``
    builds (with :mod:`kernelrpc.compiler.ir_builder`) over flat, row-major buffers."""

    def __init__(self, name: str, shapes, dtypes, inputs, fcompute, tag: str = "", attrs=None):
        from .ir import Buffer, Evaluate, Stmt
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.inputs = list(inputs)
        self.input_buffers = [Buffer(t.name, t.shape, t.dtype) for t in self.inputs]
        names = [name] if len(shapes) == 1 else [f"{name}.v{k}" for k in range(len(shapes))]
        self.output_buffers = [Buffer(n, s, d) for n, s, d in zip(names, shapes, dtypes)]
        self.body = fcompute(self.input_buffers, self.output_buffers)
        if isinstance(self.body, PrimExpr):     # lambda ins, outs: tir.call_extern(...)
            self.body = Evaluate(self.body)
        if not isinstance(self.body, Stmt):
            raise TensorError(f"extern {name}: fcompute must return a statement (ib.get()), "
                              f"got {type(self.body).__name__}")
        self.outputs = [Tensor(s, d, self, n, k)
                        for k, (n, s, d) in enumerate(zip(names, shapes, dtypes))]

    @property
    def input_tensors(self) -> list:
        return list(self.inputs)

    def __repr__(self):
        return f"extern({self.name})"


class ScanOp(Operation):
    """``te.scan``: for every state ``k``, ``out_k[:r] = init_k`` (``r = init.shape[0]``),
    then for ``t >= r`` ``out_k[t] = update_k[t]``, where the updates read
    ``state_j[t - 1, ...]`` (the outputs so far; all states advance in one time loop).

    ``init`` and ``update`` are computes owned by the scan: lowering runs them inside its
    time loop, so their stages take no schedule of their own.
    """

    def __init__(self, name: str, inits, updates, states, inputs, tag: str = "",
                 attrs=None):
        if not (len(inits) == len(updates) == len(states)) or not inits:
            raise TensorError(f"scan {name}: give one init and one update per state, got "
                              f"{len(inits)} inits, {len(updates)} updates, {len(states)} "
                              "states")
        for init, update, state in zip(inits, updates, states):
            for what, t in (("init", init), ("update", update)):
                if not isinstance(t.op, ComputeOp) or len(t.op.outputs) != 1 \
                        or isinstance(t.op.body, Reduce):
                    raise TensorError(f"scan {name}: {what} must be a single-output, "
                                      "non-reduction te.compute")
            if not isinstance(state.op, PlaceholderOp):
                raise TensorError(f"scan {name}: state must be a te.placeholder")
            if len(update.shape) != len(state.shape) or len(init.shape) != len(state.shape):
                raise TensorError(f"scan {name}: init, update and state need the same rank")
        if len(states) > 1 and (
                len({str(t.shape[0]) for t in updates}) != 1
                or len({str(t.shape[0]) for t in inits}) != 1):
            raise TensorError(f"scan {name}: every state needs the same time extent and the "
                              "same number of init rows")
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.inits, self.updates, self.states = list(inits), list(updates), list(states)
        self.inputs = list(inputs or [])
        self.outputs = [Tensor(u.shape, u.dtype, self, name if len(updates) == 1
                               else f"{name}.v{k}", k) for k, u in enumerate(updates)]

    @property
    def input_tensors(self) -> list:
        found = list(self.inputs)
        states = {st.op for st in self.states}
        for part in (*self.inits, *self.updates):
            for t in part.op.input_tensors:
                if t.op not in states and all(t is not f for f in found):
                    found.append(t)
        return found

    def __repr__(self):
        return f"scan({self.name})"


def scan(init, update, state_placeholder, inputs=None, name: str = "scan", tag: str = "",
         attrs=None):
    """TVM's ``te.scan``: the output tensor, or a list of them when lists of inits, updates
    and states are given (several states advancing together)."""
    many = isinstance(init, (list, tuple))
    if many:
        op = ScanOp(name, init, update, state_placeholder, inputs, tag, attrs)
        return list(op.outputs)
    return ScanOp(name, [init], [update], [state_placeholder], inputs, tag, attrs).output(0)


def extern(shape, inputs, fcompute, name: str = "extern", dtype=None, tag: str = "",
           attrs=None):
    """TVM's ``te.extern``: one output for a shape, a list of tensors for a list of shapes."""
    many = isinstance(shape, list) and shape and isinstance(shape[0], (list, tuple))
    shapes = [_shape(s) for s in shape] if many else [_shape(shape)]
    if dtype is None:
        dtype = inputs[0].dtype if inputs else "float32"
    dtypes = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(shapes)
    from .tag import resolve
    op = ExternOp(name, shapes, dtypes, inputs, fcompute, resolve(tag, "te.extern"), attrs)
    return list(op.outputs) if many else op.output(0)


class Tensor:
    def __init__(self, shape, dtype: str, op: Operation, name: str, value_index: int = 0):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.op = op
        self.name = name
        self.value_index = value_index

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


def compute(shape, fcompute, name: str = "compute", tag: str = "", attrs=None):
    """``te.compute(shape, lambda i, j: ..., name)``; axis names come from the lambda.

    A lambda that returns a tuple makes one op with several outputs: a list of tensors.
    """
    shape = _shape(shape)
    params = list(inspect.signature(fcompute).parameters.values())
    if len(params) == 1 and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        names = [f"i{k}" for k in range(len(shape))]
    else:
        names = [p.name for p in params]
        if len(names) != len(shape):
            raise TensorError(f"fcompute takes {len(names)} arguments, shape has {len(shape)}")
    axis = [IterVar(0, ext, Var(n)) for n, ext in zip(names, shape)]
    result = fcompute(*[iv.var for iv in axis])
    bodies = tuple(convert(b) for b in result) if isinstance(result, (tuple, list)) \
        else (convert(result),)
    if not bodies:
        raise TensorError("fcompute returned an empty tuple")
    _check_bodies(bodies)
    from .tag import resolve
    op = ComputeOp(name, axis, bodies, resolve(tag, "te.compute"), attrs)
    return op.output(0) if len(bodies) == 1 else list(op.outputs)


def _check_bodies(bodies) -> None:
    from .ir import post_order_visit

    def fn(node):
        if isinstance(node, Reduce):
            raise TensorError("a reduction (te.sum/max/min/comm_reducer) must be the whole "
                              "compute body")
    first = bodies[0]
    for body in bodies:
        if isinstance(body, Reduce) != isinstance(first, Reduce):
            raise TensorError("the outputs of one compute are all reductions or none is")
        if isinstance(body, Reduce):
            same = (body.combiner is first.combiner and body.source is not None
                    and len(body.source) == len(first.source)
                    and all(a is b for a, b in zip(body.source, first.source))
                    and body.axis == first.axis)
            if not same:
                raise TensorError("the reductions of one compute must be the elements of one "
                                  "tuple reduction")
            for part in body.source + ((body.condition,) if body.condition is not None else ()) \
                    + (body.init or ()):
                post_order_visit(part, fn)
        else:
            post_order_visit(body, fn)
    if isinstance(first, Reduce) and len(bodies) != len(first.source):
        raise TensorError(f"a {len(first.source)}-value reduction must give all its outputs")


def reduce_axis(dom, name: str = "rv") -> IterVar:
    lo, hi = dom
    both_int = isinstance(lo, int) and isinstance(hi, int)
    extent = hi - lo if both_int else convert(hi) - convert(lo)
    return IterVar(lo, extent, Var(name), IterVar.REDUCE)


def _reduce(reducer: CommReducer, expr, axis, where, init, rest):
    if axis is None or isinstance(axis, (PrimExpr, int, float)):
        binary = _ELEMENTWISE.get(reducer.name)
        if binary is None:
            raise TensorError(f"{reducer.name}: axis= (te.reduce_axis) is required")
        # elementwise form: te.max(a, b, ...)
        values = [expr] + ([] if axis is None else [axis]) + list(rest)
        values += [v for v in (where, init) if v is not None]
        out = convert(values[0])
        for v in values[1:]:
            out = binary(out, v)
        return out
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    for a in axes:
        if not isinstance(a, IterVar) or a.kind != IterVar.REDUCE:
            raise TensorError(f"{reducer.name}: axis must be te.reduce_axis, got {a!r}")
    cond = None if where is None else _as_bool(where)
    many = isinstance(expr, (tuple, list))
    source = tuple(convert(e) for e in expr) if many else (convert(expr),)
    if init is not None:
        inits = tuple(init) if isinstance(init, (tuple, list)) else (init,)
        if len(inits) != len(source):
            raise TensorError(f"{reducer.name}: init needs {len(source)} values")
        init = tuple(convert(v).astype(s.dtype) if isinstance(v, PrimExpr) else const(v, s.dtype)
                     for v, s in zip(inits, source))
    outs = tuple(Reduce(reducer, source, axes, cond, k, init) for k in range(len(source)))
    return outs if many else outs[0]


def _max2(a, b):
    from .expr import maximum
    return maximum(a, b)


def _min2(a, b):
    from .expr import minimum
    return minimum(a, b)


_ELEMENTWISE = {"sum": lambda a, b: convert(a) + b, "max": _max2, "min": _min2}
sum = CommReducer(lambda x, y: x + y, lambda t: const(0, t), "sum")  # noqa: A001 - TVM's name
max = CommReducer(_max2, min_value, "max")  # noqa: A001
min = CommReducer(_min2, max_value, "min")  # noqa: A001
