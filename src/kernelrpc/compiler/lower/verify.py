"""VerifyVars: every variable the function reads is a parameter or bound by a loop/let."""
from __future__ import annotations

from ..expr import Var
from ..ir import Mutator
from .schedule_ops import LowerError


class _FreeVars(Mutator):
    def __init__(self, bound):
        self.bound = set(bound)
        self.free: list = []

    def visit_Var(self, v):
        if v not in self.bound and v not in self.free:
            self.free.append(v)
        return v

    def _scoped(self, node, value_fields):
        for name in value_fields:
            self.visit(getattr(node, name))
        self.bound.add(node.var)
        self.visit(node.body)
        return node

    def visit_For(self, s):
        return self._scoped(s, ("min", "extent"))

    def visit_LetStmt(self, s):
        return self._scoped(s, ("value",))

    def visit_Let(self, e):
        return self._scoped(e, ("value",))


def verify_vars(func):
    checker = _FreeVars(p for p in func.params if isinstance(p, Var))
    checker.visit(func.body)
    if checker.free:
        names = ", ".join(v.name for v in checker.free)
        raise LowerError(f"{func.name} uses {names}, which no loop defines (a reduce_axis "
                         "used outside its te.sum/max/min, or a te.var missing from args?)")
    return func
