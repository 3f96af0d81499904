"""UnrollLoop: replace loops marked ``unroll`` by copies of their body with constant indices."""
from __future__ import annotations

from ..expr import IntImm
from ..ir import Allocate, For, Mutator, contains, seq, substitute


class LoopUnroller(Mutator):
    def __init__(self, max_extent: int):
        self.max_extent = max_extent

    def visit_For(self, s):
        body = self.visit(s.body)
        if (s.kind == "unrolled" and isinstance(s.extent, IntImm) and isinstance(s.min, IntImm)
                and s.extent.value <= self.max_extent and not contains(body, Allocate)):
            start = s.min.value
            return seq(*[substitute(body, {s.var: IntImm(start + i, s.var.dtype)})
                         for i in range(s.extent.value)])
        return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)


def unroll_func(func, max_extent: int):
    return func.with_body(LoopUnroller(max_extent).visit(func.body))
