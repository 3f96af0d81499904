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

from . import expr as E
from .expr import Var, const, convert, if_then_else, is_float
from .ir import post_order_visit, substitute
from .derivative import GradientError, derive
from .tensor import ComputeOp, IterVar, PlaceholderOp, Reduce, Tensor, TensorLoad, compute

__all__ = ["GradientError", "gradient"]


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
        derivative = derive(body, load, op.name)
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
