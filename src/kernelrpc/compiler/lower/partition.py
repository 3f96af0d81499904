"""LoopPartition: split a loop where its tail guards start to matter (as TVM's pass).

A guard such as ``no*64 + nco*16 + nci < 1000`` (a non-dividing split) holds for
every inner iteration while ``no < 15``.  The loop over ``no`` becomes two loops:
``[0, 15)`` without the guard and ``[15, 16)`` with it, so the main part is clean
straight-line vector code (and a cache_write tile keeps constant indices).
Only guards whose other variables are bound by loops inside the partitioned one are
used, so every guard is partitioned at one loop level at most.

A padded read's guard (a ``Select`` in an expression: ``y*2 + ry >= 1`` on the first rows,
``x + rx < 113`` on the last columns) is partitioned too, at either end of a serial loop,
where the clean part is at least half the loop: its first and last iterations keep the
selects, the loop between reads the input with none (a compare, an ``and`` and a blend
per vector load and tap less: a strided depthwise layer's inline reads 35% faster).
"""
from __future__ import annotations

from ..expr import GE, GT, LE, LT, IntImm, Select, Sub, Var
from ..ir import For, IfThenElse, Mutator, post_order_visit, seq, substitute, vars_in
from .arith import INF, and_all, bound, conjuncts, exact_linear, is_index, linear


def _negative_part(cmp):
    """``d`` such that ``cmp`` holds exactly when ``d < 0`` (integers), or None."""
    if not isinstance(cmp, (LT, LE, GT, GE)) or not is_index(cmp.a) \
            or not cmp.a.dtype.startswith("int"):
        return None
    d = Sub(cmp.a, cmp.b) if isinstance(cmp, (LT, LE)) else Sub(cmp.b, cmp.a)
    if isinstance(cmp, (LE, GE)):
        d = Sub(d, IntImm(1, cmp.a.dtype))
    return d


def _inner_ranges(body) -> dict:
    """Union of the ranges of every loop variable bound inside ``body``."""
    ranges: dict = {}

    def fn(node):
        if isinstance(node, For):
            if not (isinstance(node.min, IntImm) and isinstance(node.extent, IntImm)):
                ranges[node.var] = (-INF, INF)
                return
            lo, hi = node.min.value, node.min.value + node.extent.value - 1
            old = ranges.get(node.var, (lo, hi))
            ranges[node.var] = (min(old[0], lo), max(old[1], hi))
    post_order_visit(body, fn)
    return ranges


def _clean_bound(var: Var, cmp, inner: dict, extent: int):
    """``(t, upper)``: ``cmp`` holds for every inner value where ``var < t`` (``upper``: the
    guard bounds ``var`` from above, the dirty part is a tail) or where ``var >= t`` (a lower
    bound, the dirty part is a head); None where it depends on ``var`` otherwise or not at all."""
    d = _negative_part(cmp)
    if d is None:
        return None
    ranges = {**inner, var: (0, extent - 1)}
    if exact_linear(cmp.a, ranges) is None or exact_linear(cmp.b, ranges) is None:
        return None             # a side may wrap: the sign of the difference says nothing
    terms, const = linear(d)
    coeff, rest_hi = 0, const
    for atom, c in terms.values():
        if atom is var:
            coeff = c
            continue
        if any(v not in inner for v in vars_in(atom)):
            return None
        lo, hi = bound(atom, inner)
        extreme = max(c * lo, c * hi) if lo not in (INF, -INF) and hi not in (INF, -INF) else INF
        rest_hi += extreme
    if coeff == 0 or rest_hi == INF:
        return None
    if coeff > 0:
        return (-rest_hi - 1) // coeff + 1, True
    return rest_hi // -coeff + 1, False


class _DropGuards(Mutator):
    def __init__(self, proven: set):
        self.proven = proven

    def visit_IfThenElse(self, s):
        keep = [c for c in conjuncts(s.condition) if id(c) not in self.proven]
        then_case = self.visit(s.then_case)
        else_case = self.visit(s.else_case)
        if not keep:
            return then_case
        return IfThenElse(and_all(keep), then_case, else_case)

    def visit_Select(self, e):
        keep = [c for c in conjuncts(e.condition) if id(c) not in self.proven]
        true_value = self.visit(e.true_value)
        if not keep:
            return true_value
        return Select(and_all(keep), true_value, self.visit(e.false_value))


def _guards(body, selects: bool) -> tuple[list, list]:
    """The conjuncts of ``body``'s guards: of its ``IfThenElse`` statements without an else
    (a split's tail), and of its ``Select`` expressions where ``selects``."""
    statements, expressions = [], []

    def fn(node):
        if isinstance(node, IfThenElse) and node.else_case is None:
            statements.extend(conjuncts(node.condition))
        elif selects and isinstance(node, Select):
            expressions.extend(conjuncts(node.condition))
    post_order_visit(body, fn)
    return statements, expressions


class LoopPartitioner(Mutator):
    def visit_For(self, s):
        body = self.visit(s.body)
        loop = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)
        if not isinstance(s.extent, IntImm) or not (isinstance(s.min, IntImm)
                                                      and s.min.value == 0):
            return loop
        extent = s.extent.value
        inner = _inner_ranges(body)
        statements, expressions = _guards(body, s.kind == "serial")
        heads, tails = {}, {}
        for cmp in statements:
            found = _clean_bound(s.var, cmp, inner, extent)
            if found is not None and found[1]:
                tails[id(cmp)] = found[0]
        for cmp in expressions:         # at most half the loop left with the selects
            found = _clean_bound(s.var, cmp, inner, extent)
            if found is not None and 0 < found[0] < extent:
                t, upper = found
                if upper and 2 * t >= extent:
                    tails[id(cmp)] = t
                elif not upper and 2 * (extent - t) >= extent:
                    heads[id(cmp)] = t
        start = max(heads.values(), default=0)
        stop = min([extent, *(t for t in tails.values() if t > start)])
        if (start, stop) == (0, extent):
            return loop
        proven = {key for key, t in heads.items() if t <= start} | \
            {key for key, t in tails.items() if t >= stop}
        main = _shifted(For(s.var, s.min, IntImm(stop - start, s.extent.dtype), s.kind,
                            _DropGuards(proven).visit(body)), s.var, start)
        parts = [main]
        if start:
            parts.insert(0, For(s.var, s.min, IntImm(start, s.extent.dtype), s.kind, body))
        if stop < extent:
            parts.append(_shifted(For(s.var, s.min, IntImm(extent - stop, s.extent.dtype),
                                      s.kind, body), s.var, stop))
        return seq(*parts)


def _shifted(loop: For, var: Var, offset: int) -> For:
    """``loop`` over ``var`` from ``offset`` on, as a loop from 0 (lowering's loops start at 0)."""
    if not offset:
        return loop
    body = substitute(loop.body, {var: var + IntImm(offset, var.dtype)})
    return For(loop.var, loop.min, loop.extent, loop.kind, body)


def partition_func(func, rounds: int = 3):
    """Partition, simplify, and again: a tail loop of one iteration disappears in the
    simplification, which makes the guards of its inner loops partitionable."""
    from .simplify import simplify_func
    for _ in range(rounds):
        func = simplify_func(func.with_body(LoopPartitioner().visit(func.body)))
    return func
