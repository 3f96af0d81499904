"""VectorizeLoop: turn loops marked ``vectorize`` into Ramp/Broadcast vector code.

A guard that depends on the loop variable (the tail of a non-dividing split) is
handled by versioning: ``if (guard holds for every lane) {vector body} else {serial
loop with the guard}``.  A body that cannot be vectorized safely (a store to a
lane-invariant address, an allocation, a nested vector) stays a serial loop, and so does a
copy whose vector would gather its elements one by one (nothing computed to pay for it: a
transpose that moves the innermost axis).
"""
from __future__ import annotations

import math

from ..expr import (GE, GT, LE, LT, Add, BinaryOp, Call, Cast, FloorDiv, FloorMod, IntImm, Mul,
                    Not, PrimExpr, Select, Sub, Var, dtype_lanes, with_lanes)
from ..ir import (Broadcast, For, IfThenElse, Load, Mutator, Ramp, Store,
                  bound_vars, contains, gathers, post_order_visit, substitute, uses_var,
                  vars_in)
from .arith import and_all, conjuncts, is_index, linear, simplify


class _Scalarize(Exception):
    """The loop body cannot be vectorized; keep the loop serial."""


def _lanes(e: PrimExpr) -> int:
    return dtype_lanes(e.dtype)


def _bcast(e: PrimExpr, lanes: int) -> PrimExpr:
    return e if _lanes(e) == lanes else Broadcast(e, lanes)


def _in_one_block(ramp, divisor) -> bool:
    """Whether the lanes of ``ramp`` (stride 1) lie in one block of ``divisor``: its lanes
    divide the divisor and its base, so ``floordiv`` is the base's and ``floormod`` a ramp (a
    reshape's index of a split axis: ``floormod(i, 16)`` with ``i = 8 io + lane``)."""
    if not isinstance(ramp, Ramp) or not isinstance(ramp.stride, IntImm) or \
            ramp.stride.value != 1 or not isinstance(divisor, IntImm) or divisor.value <= 0 or \
            divisor.value % ramp.lanes or not is_index(ramp.base):
        return False
    terms, const = linear(ramp.base)
    return math.gcd(const, *(c for _, c in terms.values())) % ramp.lanes == 0


class Vectorizer(Mutator):
    """Rewrite a loop body for ``var`` in ``[0, lanes)`` as one vector iteration."""

    def __init__(self, var: Var, lanes: int):
        self.var, self.lanes = var, lanes

    def visit_Var(self, v):
        if v is self.var:
            return Ramp(IntImm(0, v.dtype), IntImm(1, v.dtype), self.lanes)
        return v

    def visit_Ramp(self, e):
        raise _Scalarize("nested vector")

    visit_Broadcast = visit_Ramp

    def generic_visit(self, node):
        if isinstance(node, BinaryOp):
            return self._binary(node)
        return super().generic_visit(node)

    def _binary(self, e):
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b and _lanes(a) == _lanes(b):    # (a rebound let is a vector)
            return e
        la, lb = _lanes(a), _lanes(b)
        if la == 1 and lb == 1:
            return type(e)(a, b)
        n = max(la, lb)
        if isinstance(e, (Add, Sub)):
            if isinstance(a, Ramp) and lb == 1:
                return Ramp(simplify(type(e)(a.base, b)), a.stride, n)
            if isinstance(b, Ramp) and la == 1 and isinstance(e, Add):
                return Ramp(simplify(Add(a, b.base)), b.stride, n)
            if isinstance(a, Ramp) and isinstance(b, Ramp):
                return Ramp(simplify(type(e)(a.base, b.base)),
                            simplify(type(e)(a.stride, b.stride)), n)
        if isinstance(e, Mul):
            if isinstance(a, Ramp) and lb == 1:
                return Ramp(simplify(Mul(a.base, b)), simplify(Mul(a.stride, b)), n)
            if isinstance(b, Ramp) and la == 1:
                return Ramp(simplify(Mul(a, b.base)), simplify(Mul(a, b.stride)), n)
        if isinstance(e, (FloorDiv, FloorMod)) and _in_one_block(a, b):
            if isinstance(e, FloorDiv):
                return simplify(FloorDiv(a.base, b))
            return Ramp(simplify(FloorMod(a.base, b)), a.stride, n)
        return type(e)(_bcast(a, n), _bcast(b, n))

    def visit_Not(self, e):
        return Not(self.visit(e.a))

    def visit_Select(self, e):
        c, t, f = self.visit(e.condition), self.visit(e.true_value), self.visit(e.false_value)
        n = max(_lanes(c), _lanes(t), _lanes(f))
        if n == 1:
            return Select(c, t, f)
        return Select(_bcast(c, n), _bcast(t, n), _bcast(f, n))

    def visit_Cast(self, e):
        v = self.visit(e.value)
        return Cast(with_lanes(e.dtype, _lanes(v)), v)

    def visit_Call(self, e):
        args = [self.visit(a) for a in e.args]
        n = max(_lanes(a) for a in args)
        return Call(with_lanes(e.dtype, n), e.op, [_bcast(a, n) for a in args])

    def visit_ExternCall(self, e):
        raise _Scalarize(f"call_extern {e.name} runs once per iteration")

    def _rebind(self, node):
        """A Let or LetStmt whose value became a vector binds a vector variable of its own."""
        value = self.visit(node.value)
        if _lanes(value) == 1:
            return type(node)(node.var, value, self.visit(node.body))
        var = Var(node.var.name, value.dtype)
        return type(node)(var, value, self.visit(substitute(node.body, {node.var: var})))

    visit_Let = _rebind

    def visit_Load(self, e):
        return Load(e.buffer, self.visit(e.index))

    def visit_Store(self, s):
        index, value = self.visit(s.index), self.visit(s.value)
        if _lanes(index) == 1:
            raise _Scalarize(f"store to {s.buffer.name} does not depend on the vector lane")
        return Store(s.buffer, _bcast(value, _lanes(index)), index)

    def visit_For(self, s):
        if uses_var(s.extent, self.var) or uses_var(s.min, self.var):
            raise _Scalarize("inner loop bounds depend on the vector lane")
        return For(s.var, s.min, s.extent, s.kind, self.visit(s.body))

    def visit_IfThenElse(self, s):
        if uses_var(s.condition, self.var):
            raise _Scalarize("condition depends on the vector lane")
        return IfThenElse(s.condition, self.visit(s.then_case), self.visit(s.else_case))

    def visit_Prefetch(self, s):
        return type(s)(s.buffer, substitute(s.index, {self.var: IntImm(0, self.var.dtype)}))

    def visit_AssertStmt(self, s):
        cond = self.visit(s.condition)
        if _lanes(cond) > 1:            # the check holds in every lane
            cond = Call("bool", "all_lanes", [cond])
        return type(s)(cond, s.message, s.code, self.visit(s.body))

    visit_LetStmt = _rebind

    def visit_Allocate(self, s):
        raise _Scalarize("allocation inside a vectorized loop")


def _all_lanes(cond, var: Var, lanes: int):
    """A condition equivalent to ``cond`` holding for every ``var`` in [0, lanes), or None."""
    if not isinstance(cond, (LT, LE, GT, GE)) or not is_index(cond.a) \
            or not cond.a.dtype.startswith("int"):
        return None             # monotonic in the lane only where nothing wraps
    if contains(cond, Load):     # hoisting would read memory outside its guards
        return None
    terms, _ = linear(Sub(cond.a, cond.b))
    coeff = 0
    for atom, c in terms.values():
        if atom is var:
            coeff = c
        elif uses_var(atom, var):
            return None
    grows = coeff > 0
    worst_high = isinstance(cond, (LT, LE))   # the difference must stay small
    at = lanes - 1 if grows == worst_high else 0
    return simplify(substitute(cond, {var: IntImm(at, var.dtype)}))


def _split_guards(body, var: Var, lanes: int):
    """Remove lane-dependent guards; returns (new body, all-lanes condition) or None."""
    inner_vars = bound_vars(body)
    conds: list = []

    class _Strip(Mutator):
        def visit_IfThenElse(self, s):
            if not uses_var(s.condition, var):
                return IfThenElse(s.condition, self.visit(s.then_case), self.visit(s.else_case))
            if s.else_case is not None:
                raise _Scalarize("lane-dependent if/else")
            keep = []
            for c in conjuncts(s.condition):
                if not uses_var(c, var):
                    keep.append(c)
                    continue
                hoisted = _all_lanes(c, var, lanes)
                if hoisted is None or vars_in(hoisted) & inner_vars:
                    raise _Scalarize("guard cannot be hoisted")
                conds.append(hoisted)
            then_case = self.visit(s.then_case)
            return IfThenElse(and_all(keep), then_case) if keep else then_case

    new_body = _Strip().visit(body)
    return new_body, (simplify(and_all(conds)) if conds else None)


def _gathers_a_copy(vector) -> bool:
    """Whether a vectorized body stores the values it loads as they are (converted or
    selected at most) and one of its loads reads its lanes one by one (:func:`ir.gathers`)."""
    found, computes = [], []

    def value(e):
        if isinstance(e, Load):
            if gathers(e.index):
                found.append(e)
        elif isinstance(e, Select):
            value(e.true_value)
            value(e.false_value)
        elif isinstance(e, (Cast, Broadcast)):
            value(e.value)
        elif isinstance(e, (BinaryOp, Call)):
            computes.append(e)

    post_order_visit(vector, lambda n: value(n.value) if isinstance(n, Store) else None)
    return bool(found) and not computes


def _fallback_kind(loop, body) -> str:
    """A short loop body that cannot be vectorized is unrolled instead: lane offsets become
    constants, so an accumulator tile it touches keeps constant indices."""
    short = isinstance(loop.extent, IntImm) and loop.extent.value <= 16
    return "unrolled" if short and not contains(body, For) else "serial"


class LoopVectorizer(Mutator):
    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def visit_For(self, s):
        body = self.visit(s.body)
        if s.kind != "vectorized":
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)
        if not self.enabled:
            return For(s.var, s.min, s.extent, "serial", body)
        serial = For(s.var, s.min, s.extent, _fallback_kind(s, body), body)
        if (not isinstance(s.extent, IntImm)
                or not (isinstance(s.min, IntImm) and s.min.value == 0) or s.extent.value < 2):
            return serial
        lanes = s.extent.value
        try:
            stripped, guard = _split_guards(body, s.var, lanes)
            vector = Vectorizer(s.var, lanes).visit(stripped)
        except _Scalarize:
            return serial
        if _gathers_a_copy(vector):
            return serial
        if guard is None:
            return vector
        if isinstance(guard, IntImm):
            return vector if guard.value else serial
        return IfThenElse(guard, vector, serial)


def vectorize_func(func, enabled: bool = True):
    return func.with_body(LoopVectorizer(enabled).visit(func.body))

