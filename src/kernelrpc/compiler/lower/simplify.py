"""Simplify: fold constants and provable conditions, drop empty and single-trip loops."""
from __future__ import annotations

from ..expr import IntImm, Not
from ..ir import Allocate, AssertStmt, For, IfThenElse, LetStmt, seq, substitute
from .arith import Simplifier


class StmtSimplifier(Simplifier):
    """Expression simplification plus statement clean-up, with loop ranges in scope."""

    def visit_For(self, s):
        lo, extent = self.visit(s.min), self.visit(s.extent)
        if isinstance(extent, IntImm) and extent.value <= 0:
            return None
        if isinstance(extent, IntImm) and extent.value == 1:
            return self.visit(substitute(s.body, {s.var: lo}))
        known = isinstance(lo, IntImm) and isinstance(extent, IntImm)
        if known:
            self.ranges[s.var] = (lo.value, lo.value + extent.value - 1)
        body = self.visit(s.body)
        self.ranges.pop(s.var, None)
        if body is None:
            return None
        if body is s.body and lo is s.min and extent is s.extent:
            return s
        return For(s.var, lo, extent, s.kind, body)

    def visit_IfThenElse(self, s):
        cond = self.visit(s.condition)
        if isinstance(cond, IntImm):
            return self.visit(s.then_case if cond.value else s.else_case)
        then_case, else_case = self.visit(s.then_case), self.visit(s.else_case)
        if then_case is None and else_case is None:
            return None
        if then_case is None:
            return IfThenElse(self.visit(Not(cond)), else_case)
        return IfThenElse(cond, then_case, else_case)

    def visit_SeqStmt(self, s):
        return seq(*[self.visit(x) for x in s.seq])

    def visit_Allocate(self, s):
        body = self.visit(s.body)
        return None if body is None else (s if body is s.body else Allocate(s.buffer, body))

    def visit_AssertStmt(self, s):
        cond, body = self.visit(s.condition), self.visit(s.body)
        if body is None or (isinstance(cond, IntImm) and cond.value):
            return body
        return AssertStmt(cond, s.message, s.code, body)

    def visit_LetStmt(self, s):
        value, body = self.visit(s.value), self.visit(s.body)
        return None if body is None else LetStmt(s.var, value, body)


def simplify_func(func):
    return func.with_body(StmtSimplifier().visit(func.body))
