"""UnswitchLoop: an innermost serial loop whose body guards statements by a condition the loop
does not change becomes two loops, one with those statements and one without, the condition
tested once before them; each serial loop around whose whole body is then that test goes
inside it too, so the test leaves the whole loop nest.

Such a guard is a register tile's last rows where the rows' split does not divide and the
tile loop is fused into the parallel one (a batched MatMul over 197 tokens, rows in tiles of
6): LoopPartition cannot split a fused loop, so after unrolling the guard stayed inside the
reduction, a compare and a branch a step around the last row's multiply-adds. AVX2 code on
a Zen 2 core, one thread: ViT's attention product (4 heads, 197 x 197 by 197 x 64) 402 ->
199 us, 49 -> 100 GFLOP/s (onnxruntime 225 us); ViT 10.12 -> 9.70 ms, two threads 6.49 ->
6.23 (A/B in one process); the CNNs and transformers whose kernels it changed within 2%.
"""
from __future__ import annotations

from ..ir import (BufferPointer, ExternCall, For, IfThenElse, Load, Mutator, bound_vars,
                  contains, expr_to_str, post_order_visit, seq, vars_in)
from ..expr import LT, Call, IntImm, Mul

#: how many distinct guards one loop is unswitched on (2**n copies of its body)
MAX_GUARDS = 2


def _pure(cond) -> bool:
    """No memory reads or calls: the condition's value depends on its variables alone."""
    return not contains(cond, (Load, BufferPointer, ExternCall, Call))


def _key(cond) -> str:
    """The printed condition, ``x*c < k`` (``c > 0``) as ``x < ceil(k/c)``: a tile's last rows
    guard ``row*6 < 126``, ``row*6 < 125``... alike, one condition to unswitch on."""
    if isinstance(cond, LT) and isinstance(cond.b, IntImm) and isinstance(cond.a, Mul):
        x, c = (cond.a.a, cond.a.b) if isinstance(cond.a.b, IntImm) else (cond.a.b, cond.a.a)
        if isinstance(c, IntImm) and c.value > 0:
            return f"{expr_to_str(x)} < {-(-cond.b.value // c.value)}"
    return expr_to_str(cond)


def _invariant_guard(loop: For):
    """The condition of the first guard in ``loop``'s body that the loop does not change."""
    inner = bound_vars(loop.body) | {loop.var}
    found = []

    def fn(node):
        if isinstance(node, IfThenElse) and node.else_case is None and _pure(node.condition) \
                and not vars_in(node.condition) & inner:
            found.append(node.condition)
    post_order_visit(loop.body, fn)
    return found[0] if found else None


class _Resolve(Mutator):
    """The body with every guard whose :func:`_key` is ``key`` taken or dropped."""

    def __init__(self, key: str, holds: bool):
        self.key, self.holds = key, holds

    def visit_IfThenElse(self, s):
        if s.else_case is None and _key(s.condition) == self.key:
            return self.visit(s.then_case) if self.holds else None
        return self.generic_visit(s)

    def visit_SeqStmt(self, s):
        parts = [self.visit(x) for x in s.seq]
        return seq(*[x for x in parts if x is not None])


class LoopUnswitcher(Mutator):
    def visit_For(self, s):
        body = self.visit(s.body)
        loop = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body)
        return self._lift(self._unswitch(loop, MAX_GUARDS))

    @staticmethod
    def _lift(loop):
        """A serial loop whose whole body is a guard it does not change, inside the guard (so
        an unswitched guard leaves the whole reduction: the rows' and the window's loops)."""
        if not isinstance(loop, For) or loop.kind != "serial":
            return loop
        guard = loop.body
        if not isinstance(guard, IfThenElse) or not _pure(guard.condition) or \
                vars_in(guard.condition) & {loop.var}:
            return loop
        copies = [None if case is None else For(loop.var, loop.min, loop.extent, loop.kind, case)
                  for case in (guard.then_case, guard.else_case)]
        return IfThenElse(guard.condition, *copies)

    def _unswitch(self, loop: For, guards: int):
        if guards == 0 or loop.kind != "serial" or contains(loop.body, For):
            return loop
        cond = _invariant_guard(loop)
        if cond is None:
            return loop
        key = _key(cond)
        copies = []
        for holds in (True, False):
            body = _Resolve(key, holds).visit(loop.body)
            copies.append(None if body is None else self._unswitch(
                For(loop.var, loop.min, loop.extent, loop.kind, body), guards - 1))
        if copies[0] is None:
            return loop
        return IfThenElse(cond, copies[0], copies[1])


def unswitch_func(func):
    return func.with_body(LoopUnswitcher().visit(func.body))
