"""LoopPartition: split a loop where its tail guards start to matter (as TVM's pass).

A guard such as ``no*64 + nco*16 + nci < 1000`` (a non-dividing split) holds for
every inner iteration while ``no < 15``.  The loop over ``no`` becomes two loops:
``[0, 15)`` without the guard and ``[15, 16)`` with it, so the main part is clean
straight-line vector code (and a cache_write tile keeps constant indices).
Only guards whose other variables are bound by loops inside the partitioned one are
used, so every guard is partitioned at one loop level at most.
"""
from __future__ import annotations

from ..expr import GE, GT, LE, LT, IntImm, Sub, Var
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


def _clean_prefix(var: Var, cmp, inner: dict, extent: int):
    """Largest ``t`` such that ``cmp`` holds for all ``var < t`` and every inner value."""
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
    if coeff <= 0 or rest_hi == INF:
        return None
    return (-rest_hi - 1) // coeff + 1


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


class LoopPartitioner(Mutator):
    def visit_For(self, s):
        body = self.visit(s.body)
        loop = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)
        if not isinstance(s.extent, IntImm) or not (isinstance(s.min, IntImm)
                                                      and s.min.value == 0):
            return loop
        extent = s.extent.value
        inner = _inner_ranges(body)
        guards: list = []

        def fn(node):
            if isinstance(node, IfThenElse) and node.else_case is None:
                guards.extend(conjuncts(node.condition))
        post_order_visit(body, fn)
        limits = {}
        for cmp in guards:
            t = _clean_prefix(s.var, cmp, inner, extent)
            if t is not None:
                limits[id(cmp)] = t
        if not limits:
            return loop
        split = min(limits.values())
        if not 0 < split < extent:
            return loop
        proven = {key for key, t in limits.items() if t >= split}
        main = For(s.var, s.min, IntImm(split, s.extent.dtype), s.kind,
                   _DropGuards(proven).visit(body))
        shifted = substitute(body, {s.var: s.var + IntImm(split, s.var.dtype)})
        tail = For(s.var, s.min, IntImm(extent - split, s.extent.dtype), s.kind, shifted)
        return seq(main, tail)


def partition_func(func, rounds: int = 3):
    """Partition, simplify, and again: a tail loop of one iteration disappears in the
    simplification, which makes the guards of its inner loops partitionable."""
    from .simplify import simplify_func
    for _ in range(rounds):
        func = simplify_func(func.with_body(LoopPartitioner().visit(func.body)))
    return func
