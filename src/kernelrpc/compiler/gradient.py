"""TVM's ``te.gradient``: reverse-mode differentiation of tensor expressions.

``gradient(output, inputs, head=None)`` returns, for each input, the adjoint tensor:
``sum over the output's elements o of head[p, o] * d output[o] / d input[j]`` at ``[p, j]``,
where ``p`` are the leading dimensions ``head`` has beyond ``output.shape``. Without ``head``
it is the identity of ``output.shape + output.shape``, so each result is the full Jacobian
(``output.shape + input.shape``), as in TVM; pass ``head`` of ``output.shape`` (the adjoint of a
scalar loss, often ``te.placeholder(output.shape)`` or ones) for the usual vector-Jacobian
product of ``input.shape``.

The results are compute tensors like any other: schedule and build them together with the
forward computation. Supported: element-wise bodies of arithmetic, ``te.if_then_else``,
``te.max``/``te.min`` of two values, casts between float types and the differentiable math
functions; sum reductions (with ``where=``); indices that are loop variables, a variable plus
or minus a constant, or constants (any other index is handled too, by a sum with a condition,
at a cost proportional to the product of the extents). Anything else (a ``max`` reduction,
``fmod``, integer outputs, extern or scan ops on the way) raises :class:`GradientError` naming it.
"""
from __future__ import annotations

import math

from . import expr as E
from .expr import Var, const, convert, if_then_else, is_float
from .ir import post_order_visit, substitute
from .tensor import ComputeOp, IterVar, PlaceholderOp, Reduce, Tensor, TensorLoad, compute


class GradientError(ValueError):
    """te.gradient met a construct it cannot differentiate; the message names it."""


def gradient(output: Tensor, inputs, head: Tensor | None = None) -> list[Tensor]:
    """The adjoints of ``output`` with respect to each of ``inputs`` (a tensor or a list), as a
    list in the order of ``inputs`` (TVM's, for one tensor too)."""
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not is_float(output.dtype):
        raise GradientError(f"te.gradient: {output.name} is {output.dtype}; only float outputs "
                            "have a gradient")
    for x in inputs:
        if not isinstance(x, Tensor):
            raise GradientError(f"te.gradient: inputs must be tensors, got {x!r}")
        if not is_float(x.dtype):
            raise GradientError(f"te.gradient: input {x.name} is {x.dtype}; only float tensors "
                                "have a gradient")
    if head is None:
        head = _identity(output)
    n = len(output.shape)
    if len(head.shape) < n or not all(_same(a, b) for a, b in zip(head.shape[len(head.shape) - n:],
                                                                  output.shape)):
        raise GradientError(f"te.gradient: head has shape {list(head.shape)}; it must end with "
                            f"the output's shape {list(output.shape)}")
    prefix = tuple(head.shape[:len(head.shape) - n])
    order = _ops_between(output, inputs)
    adjoints: dict = {_key(output): [head]}
    result: dict = {}
    for tensor in order:                  # outputs before the tensors they read
        parts = adjoints.get(_key(tensor), [])
        adjoint = _sum_all(parts, prefix, tensor)
        result[_key(tensor)] = adjoint
        if isinstance(tensor.op, PlaceholderOp) or adjoint is None:
            continue
        for x in tensor.op.input_tensors:
            if any(_key(x) == _key(t) for t in order):
                adjoints.setdefault(_key(x), []).extend(_contributions(tensor, x, adjoint, prefix))
    return [result.get(_key(x)) or _zeros(prefix, x) for x in inputs]


# ---------------------------------------------------------------------------- the graph

def _key(t: Tensor) -> tuple:
    return (id(t.op), t.value_index)


def _same(a, b) -> bool:
    a, b = convert(a), convert(b)
    if isinstance(a, E.IntImm) and isinstance(b, E.IntImm):
        return a.value == b.value
    return a is b


def _ops_between(output: Tensor, inputs) -> list[Tensor]:
    """Tensors on a path from ``output`` to one of ``inputs``, consumers first."""
    wanted = {_key(x) for x in inputs}
    post: list[Tensor] = []
    seen: dict = {}

    def leads(t: Tensor) -> bool:
        k = _key(t)
        if k in seen:
            return seen[k]
        seen[k] = False
        op = t.op
        hit = k in wanted
        if not isinstance(op, PlaceholderOp):
            if not isinstance(op, ComputeOp):
                if any(leads(x) for x in op.input_tensors):
                    raise GradientError(f"te.gradient: {op.name} is a {type(op).__name__} "
                                        "(te.extern / te.scan); only te.compute ops can be "
                                        "differentiated")
                return False
            if len(op.bodies) > 1:
                if any(leads(x) for x in op.input_tensors):
                    raise GradientError(f"te.gradient: {op.name} has several outputs (a tuple "
                                        "compute or reduction); that is not supported")
                return False
            for x in op.input_tensors:
                hit = leads(x) or hit
        seen[k] = hit
        if hit:
            post.append(t)
        return hit

    leads(output)
    return list(reversed(post))


def _identity(output: Tensor) -> Tensor:
    n = len(output.shape)

    def body(*idx):
        return if_then_else(E.all_of(*[idx[k] == idx[n + k] for k in range(n)]) if n else True,
                            const(1.0, output.dtype), const(0.0, output.dtype))
    return compute(tuple(output.shape) * 2, body, name=f"{output.name}.identity")


def _zeros(prefix, x: Tensor) -> Tensor:
    return compute(prefix + tuple(x.shape), lambda *idx: const(0.0, x.dtype), name=f"{x.name}.grad")


def _sum_all(parts, prefix, tensor: Tensor):
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]

    def body(*idx):
        total = parts[0][idx]
        for p in parts[1:]:
            total = total + p[idx]
        return total
    return compute(prefix + tuple(tensor.shape), body, name=f"{tensor.name}.grad")


# ---------------------------------------------------------------------------- one consumer

def _contributions(consumer: Tensor, x: Tensor, adjoint: Tensor, prefix) -> list[Tensor]:
    """What ``consumer``'s reads of ``x`` add to ``x``'s adjoint, one tensor per read."""
    op = consumer.op
    body = op.body
    reduce_axes: list = []
    condition = None
    if isinstance(body, Reduce):
        if body.combiner.name != "sum":
            raise GradientError(f"te.gradient: {op.name} is a {body.combiner.name} reduction; "
                                "only sums (te.sum) are supported")
        if body.init is not None and any(_reads(i, x) for i in body.init):
            raise GradientError(f"te.gradient: the init= of {op.name} reads {x.name}")
        reduce_axes = list(body.axis)
        condition = body.condition
        body = body.source[0]
    loads: list = []
    post_order_visit(body, lambda n: loads.append(n) if isinstance(n, TensorLoad)
                     and _key(n.tensor) == _key(x) and all(n is not m for m in loads) else None)
    if condition is not None and _reads(condition, x):
        raise GradientError(f"te.gradient: the where= of {op.name} reads {x.name}")
    terms = []
    for load in loads:
        derivative = _derive(body, load, op.name)
        if derivative is not None:
            terms.append(_Term(op, x, load, derivative, adjoint, prefix, reduce_axes, condition))
    name = f"{x.name}.grad.{op.name}"
    pointwise = [t for t in terms if not t.sums]
    out = []
    if pointwise:                         # one tensor for every read that sums nothing
        def body_of(*idx):
            total = pointwise[0](idx)
            for t in pointwise[1:]:
                total = total + t(idx)
            return total
        out.append(compute(prefix + tuple(x.shape), body_of, name=name))
    for k, term in enumerate(t for t in terms if t.sums):
        out.append(compute(prefix + tuple(x.shape), _body_of(term),
                           name=f"{name}.sum{k}" if k or pointwise else name))
    return out


def _body_of(term):
    def body(*idx):
        return term(idx)
    return body


def _reads(node, x: Tensor) -> bool:
    found = []
    post_order_visit(node, lambda n: found.append(n) if isinstance(n, TensorLoad)
                     and _key(n.tensor) == _key(x) else None)
    return bool(found)


class _Term:
    """One read ``load`` of ``x`` in ``op``: ``adjoint[p, i] * derivative`` summed onto
    ``x[p, j]`` wherever the read's index is j. ``sums`` tells whether the axes the index does
    not pin down make it a reduction (a sum-reduction's axes, or broadcast axes)."""

    def __init__(self, op: ComputeOp, x: Tensor, load: TensorLoad, derivative, adjoint: Tensor,
                 prefix, reduce_axes, condition):
        self.op, self.x, self.load, self.derivative = op, x, load, derivative
        self.adjoint, self.np = adjoint, len(prefix)
        self.axes = list(op.axis) + list(reduce_axes)
        self.condition = condition
        domains = {iv.var for iv in self.axes}
        pinned = set()
        for index in load.indices:
            var, _ = _var_plus_const(index)
            if var is not None and var in domains:
                pinned.add(var)
        self.sums = any(iv.var not in pinned for iv in self.axes)

    def __call__(self, idx):
        op, x, load = self.op, self.x, self.load
        p, j = idx[:self.np], idx[self.np:]
        domains = {iv.var: iv for iv in self.axes}
        mapping: dict = {}
        conds = []
        pending = []
        for dim, (index, target) in enumerate(zip(load.indices, j)):
            var, shift = _var_plus_const(index)
            if var is not None and var in domains and var not in mapping:
                mapping[var] = target - shift if shift else target
                iv = domains[var]
                if not (shift == 0 and _same(iv.dom_min, 0) and _same(iv.extent, x.shape[dim])):
                    value = mapping[var]
                    conds += [value >= iv.dom_min, value < iv.dom_min + iv.extent]
            else:
                pending.append((index, target))
        free = [iv for iv in self.axes if iv.var not in mapping]
        fresh = {iv.var: Var(f"{iv.var.name}.r", iv.var.dtype) for iv in free}
        values = {**mapping, **fresh}
        for index, target in pending:
            conds.append(substitute(index, values) == target)
        if self.condition is not None:
            conds.append(substitute(self.condition, values))
        term = self.adjoint[tuple(p) + tuple(substitute(iv.var, values) for iv in op.axis)] \
            * substitute(self.derivative, values)
        if term.dtype != x.dtype:
            term = term.astype(x.dtype)
        cond = E.all_of(*conds) if conds else None
        if free:
            from .tensor import sum as te_sum
            reduce = [IterVar(iv.dom_min, iv.extent, fresh[iv.var], IterVar.REDUCE) for iv in free]
            return te_sum(term, axis=reduce, where=cond)
        return term if cond is None else if_then_else(cond, term, const(0.0, x.dtype))


def _var_plus_const(index) -> tuple:
    """``(v, c)`` for an index ``v``, ``v + c`` or ``v - c`` (c a constant), else ``(None, 0)``."""
    if isinstance(index, Var):
        return index, 0
    if isinstance(index, (E.Add, E.Sub)) and isinstance(index.a, Var) and isinstance(index.b, E.IntImm):
        return index.a, index.b.value if isinstance(index, E.Add) else -index.b.value
    if isinstance(index, E.Add) and isinstance(index.b, Var) and isinstance(index.a, E.IntImm):
        return index.b, index.a.value
    return None, 0


# ---------------------------------------------------------------------------- derivatives

def _derive(node, target: TensorLoad, where: str):
    """d node / d target (the read ``target``, other reads held constant), or None for 0."""
    if node is target:
        return const(1.0, node.dtype)
    if isinstance(node, (TensorLoad, Var, E.IntImm, E.FloatImm, E.CmpOp, E.And, E.Or, E.Not)):
        return None
    rule = _RULES.get(type(node))
    if rule is None:
        raise GradientError(f"te.gradient: {where}: {type(node).__name__} ({node!r}) cannot be "
                            "differentiated")
    return rule(node, target, where)


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _mul(a, b):
    return None if a is None or b is None else a * b


def _neg(a):
    return None if a is None else -a


def _binary(node, target, where):
    da, db = _derive(node.a, target, where), _derive(node.b, target, where)
    if da is None and db is None:
        return None
    if not is_float(node.dtype):
        raise GradientError(f"te.gradient: {where}: {node!r} is integer arithmetic on a float "
                            "value; it cannot be differentiated")
    a, b = node.a, node.b
    kind = type(node)
    if kind is E.Add:
        return _add(da, db)
    if kind is E.Sub:
        return _add(da, _neg(db))
    if kind is E.Mul:
        return _add(_mul(da, b), _mul(a, db))
    if kind is E.Div:
        return _add(_mul(da, 1.0 / b) if da is not None else None,
                    _neg(_mul(db, a / (b * b))) if db is not None else None)
    if kind in (E.Min, E.Max):
        zero = const(0.0, node.dtype)
        first = (a <= b) if kind is E.Min else (a >= b)
        return if_then_else(first, zero if da is None else da, zero if db is None else db)
    raise GradientError(f"te.gradient: {where}: {kind.__name__} ({node!r}) cannot be differentiated")


def _select(node, target, where):
    dt, df = _derive(node.true_value, target, where), _derive(node.false_value, target, where)
    if dt is None and df is None:
        return None
    zero = const(0.0, node.dtype)
    return if_then_else(node.condition, zero if dt is None else dt, zero if df is None else df)


def _cast(node, target, where):
    d = _derive(node.value, target, where)
    if d is None:
        return None
    if not (is_float(node.dtype) and is_float(node.value.dtype)):
        raise GradientError(f"te.gradient: {where}: the cast {node!r} leaves the floats; it "
                            "cannot be differentiated")
    return d.astype(node.dtype)


def _m(name, *args):
    return E.call_math(name, *args)


_LN2, _LN10 = math.log(2.0), math.log(10.0)
#: math function -> d f(x) / dx, as an expression of x and f(x)
_UNARY = {
    "exp": lambda x, f: f,
    "exp2": lambda x, f: f * _LN2,
    "exp10": lambda x, f: f * _LN10,
    "log": lambda x, f: 1.0 / x,
    "log2": lambda x, f: 1.0 / (x * _LN2),
    "log10": lambda x, f: 1.0 / (x * _LN10),
    "log1p": lambda x, f: 1.0 / (x + 1.0),
    "sqrt": lambda x, f: 0.5 / f,
    "tanh": lambda x, f: 1.0 - f * f,
    "sinh": lambda x, f: _m("cosh", x),
    "cosh": lambda x, f: _m("sinh", x),
    "sin": lambda x, f: _m("cos", x),
    "cos": lambda x, f: -_m("sin", x),
    "tan": lambda x, f: 1.0 + f * f,
    "asin": lambda x, f: 1.0 / _m("sqrt", 1.0 - x * x),
    "acos": lambda x, f: -1.0 / _m("sqrt", 1.0 - x * x),
    "atan": lambda x, f: 1.0 / (1.0 + x * x),
    "erf": lambda x, f: (2.0 / math.sqrt(math.pi)) * _m("exp", -(x * x)),
    "fabs": lambda x, f: if_then_else(x >= 0.0, const(1.0, x.dtype), const(-1.0, x.dtype)),
}
_STEPS = ("floor", "ceil", "round", "nearbyint", "trunc")   # flat almost everywhere: 0


def _call(node, target, where):
    op, args = node.op, node.args
    ds = [_derive(a, target, where) for a in args]
    if all(d is None for d in ds):
        return None
    if op in _STEPS:
        return None
    if op in _UNARY:
        return _mul(ds[0], _UNARY[op](args[0], node))
    if op == "pow":
        a, b = args
        return _add(_mul(ds[0], b * _m("pow", a, b - 1.0)), _mul(ds[1], node * _m("log", a)))
    if op == "atan2":
        y, x = args
        r2 = x * x + y * y
        return _add(_mul(ds[0], x / r2), _neg(_mul(ds[1], y / r2)))
    if op == "hypot":
        a, b = args
        return _add(_mul(ds[0], a / node), _mul(ds[1], b / node))
    if op == "fma":
        a, b, _c = args
        return _add(_add(_mul(ds[0], b), _mul(a, ds[1])), ds[2])
    raise GradientError(f"te.gradient: {where}: {op}() cannot be differentiated")


_RULES = {E.Add: _binary, E.Sub: _binary, E.Mul: _binary, E.Div: _binary, E.Min: _binary,
          E.Max: _binary, E.Select: _select, E.Cast: _cast, E.Call: _call}
