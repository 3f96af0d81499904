"""NormalizeParallel: only the outermost parallel loop of a nest runs in parallel.

The runtime's thread pool runs one parallel region at a time, so a parallel loop
nested in another (e.g. a stage attached inside a parallel loop that is itself
marked parallel) becomes serial.
"""
from __future__ import annotations

from ..ir import For, Mutator


class _Demote(Mutator):
    def __init__(self):
        self.inside = False

    def visit_For(self, s):
        if s.kind != "parallel":
            body = self.visit(s.body)
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)
        if self.inside:
            return For(s.var, s.min, s.extent, "serial", self.visit(s.body))
        self.inside = True
        try:
            body = self.visit(s.body)
        finally:
            self.inside = False
        return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)


def normalize_parallel_func(func):
    return func.with_body(_Demote().visit(func.body))
