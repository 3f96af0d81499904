"""Out-of-bounds accesses: refused at build time when provable, checked at run time on request.

* ``check_static_bounds`` looks at every ``tensor[i, j, ...]`` of a compute definition. Where an
  index is a linear form of the stage's axes (each with a constant range) and no
  ``if_then_else`` or ``where=`` guards it, its interval is exact and attained, so an interval
  that leaves ``[0, extent)`` is an access the kernel *will* make: a ``LowerError`` names the
  tensor, the dimension, the index and both ranges. Index arithmetic on the axes that would
  leave its dtype (int32 ``i * 100000 * 100000``) is refused the same way.
* ``instrument_bound_checkers`` (TVM's ``tir.instrument_bound_checkers`` option) puts an
  ``AssertStmt`` before every store whose own index, or the index of a load it evaluates, is
  not proven inside its buffer by the loop ranges. Compiled code then returns
  ``ERR_OUT_OF_BOUNDS`` (the runtime raises ``KernelError``); the interpreter raises
  ``IROutOfBounds``. Loads inside an ``if_then_else`` branch are checked only where the branch
  is taken.
"""
from __future__ import annotations

from ..expr import (Add, Cast, FloorDiv, FloorMod, IntImm, Mul, PrimExpr, Select, Sub, Var, const,
                    convert, is_int, logical_and)
from ..ir import ERR_OUT_OF_BOUNDS, AssertStmt, For, IfThenElse, LetStmt, Load, Mutator, vars_in
from ..printer import Printer
from ..tensor import ComputeOp, Reduce, TensorLoad
from .arith import bound, exact_bound, fits, linear, simplify
from .schedule_ops import LowerError


# --------------------------------------------------------------------------- build time

def _axis_ranges(op: ComputeOp) -> dict | None:
    ranges = {}
    for iv in list(op.axis) + list(op.reduce_axis):
        lo, ext = simplify(iv.dom_min), simplify(iv.extent)
        if isinstance(lo, IntImm) and isinstance(ext, IntImm):
            if ext.value <= 0:
                return None                     # the stage never runs
            ranges[iv.var] = (lo.value, lo.value + ext.value - 1)
    return ranges


def _loads(e, guarded: bool, out: list) -> None:
    """Every TensorLoad below ``e`` with whether a condition guards it."""
    if isinstance(e, TensorLoad):
        out.append((e, guarded))
        for i in e.indices:
            _loads(i, guarded, out)
        return
    if isinstance(e, Reduce):
        if e.condition is not None:
            _loads(e.condition, guarded, out)
        for x in e.source:
            _loads(x, guarded or e.condition is not None, out)
        for x in e.init or ():
            _loads(x, guarded, out)
        return
    if isinstance(e, Select):
        _loads(e.condition, guarded, out)
        _loads(e.true_value, True, out)
        _loads(e.false_value, True, out)
        return
    for name in getattr(e, "_fields", ()):
        child = getattr(e, name)
        if isinstance(child, PrimExpr):
            _loads(child, guarded, out)
        elif isinstance(child, tuple):
            for c in child:
                if isinstance(c, PrimExpr):
                    _loads(c, guarded, out)


def _tight_interval(e, ranges):
    """(lo, hi) of ``e`` over the axes' ranges with both ends attained, or None.

    Linear forms over independent attained atoms (each variable in one term only),
    floordiv by a positive constant (monotone) and floormod of a variable sweeping at least
    the divisor (every remainder) qualify; anything else is None.
    """
    while isinstance(e, Cast) and is_int(e.value.dtype) and is_int(e.dtype) \
            and fits(bound(e.value, ranges), e.dtype):
        e = e.value                             # a widening cast keeps the value
    if isinstance(e, IntImm):
        return e.value, e.value
    if isinstance(e, Var):
        return ranges.get(e)
    if isinstance(e, (FloorDiv, FloorMod)) and isinstance(e.b, IntImm) and e.b.value > 0:
        inner = _tight_interval(e.a, ranges)
        if inner is None:
            return None
        lo, hi = inner
        c = e.b.value
        if isinstance(e, FloorDiv):
            return lo // c, hi // c
        terms, _ = linear(e.a)
        step_one = len(terms) == 1 and abs(next(iter(terms.values()))[1]) == 1
        if lo // c == hi // c:
            return (lo % c, hi % c) if step_one else None
        return (0, c - 1) if step_one and hi - lo + 1 >= c else None
    terms, k = linear(e)
    if len(terms) == 1:
        (atom, c), = terms.values()
        if atom is e:
            return None
    lo = hi = k
    seen: set = set()
    for atom, c in terms.values():
        used = vars_in(atom)
        if used & seen:
            return None
        seen |= used
        inner = _tight_interval(atom, ranges)
        if inner is None:
            return None
        a, b = inner
        lo += min(c * a, c * b)
        hi += max(c * a, c * b)
    return lo, hi


def _overflowing_node(index, ranges):
    """An Add/Sub/Mul of axes and constants inside ``index`` whose result leaves its dtype."""
    found = []

    def visit(e):
        if isinstance(e, (Add, Sub, Mul)) and is_int(e.dtype) and not found:
            if all(v in ranges for v in vars_in(e)) and not _has_load(e) \
                    and not fits(exact_bound(e, ranges), e.dtype):
                found.append(e)
        for name in getattr(e, "_fields", ()):
            child = getattr(e, name)
            if isinstance(child, PrimExpr):
                visit(child)
    visit(index)
    return found[0] if found else None


def _has_load(e) -> bool:
    if isinstance(e, TensorLoad):
        return True
    return any(isinstance(getattr(e, n), PrimExpr) and _has_load(getattr(e, n))
               for n in getattr(e, "_fields", ()))


def check_static_bounds(op: ComputeOp) -> None:
    """Raise LowerError for an access of ``op``'s definition that is provably out of bounds."""
    ranges = _axis_ranges(op)
    if ranges is None:
        return
    found: list = []
    for body in op.bodies[:1] if isinstance(op.body, Reduce) else op.bodies:
        _loads(body, False, found)
    printer = Printer()
    for load, guarded in found:
        tensor = load.tensor
        for dim, (index, extent) in enumerate(zip(load.indices, tensor.shape)):
            where = (f"{op.name} reads {tensor.name}[{', '.join(map(printer.expr, load.indices))}]"
                     f" (dimension {dim}: {printer.expr(index)})")
            bad = _overflowing_node(index, ranges)
            if bad is not None:
                lo, hi = exact_bound(bad, ranges)
                raise LowerError(f"{where}: {printer.expr(bad)} reaches [{lo}, {hi}], past "
                                 f"{bad.dtype}; compute the index in int64 (.astype('int64'))")
            n = simplify(convert(extent))
            interval = _tight_interval(index, ranges)
            if guarded or interval is None or not isinstance(n, IntImm):
                continue
            lo, hi = interval
            if lo < 0 or hi >= n.value:
                raise LowerError(f"{where}: the index ranges over [{lo}, {hi}], outside the "
                                 f"extent [0, {n.value}) of {tensor.name}")


# --------------------------------------------------------------------------- run time

def _in_bounds(buffer, index) -> PrimExpr:
    size = buffer.size
    size = const(size, index.dtype) if isinstance(size, int) else convert(size).astype(index.dtype)
    return logical_and(index >= const(0, index.dtype), index < size)


class _Instrumenter(Mutator):
    def __init__(self):
        self.ranges: dict = {}

    def _proven(self, buffer, index) -> bool:
        size = buffer.size
        if not isinstance(size, int):
            return False
        lo, hi = bound(index, self.ranges)
        return 0 <= lo and hi < size

    def _checks(self, e, guard, out: list) -> None:
        """(condition, message) for every unproven load below ``e``, innermost first."""
        if isinstance(e, Select):
            self._checks(e.condition, guard, out)
            c = e.condition
            self._checks(e.true_value, c if guard is None else logical_and(guard, c), out)
            nc = ~c
            self._checks(e.false_value, nc if guard is None else logical_and(guard, nc), out)
            return
        for name in e._fields:
            child = getattr(e, name)
            if isinstance(child, PrimExpr):
                self._checks(child, guard, out)
            elif isinstance(child, tuple):
                for c in child:
                    if isinstance(c, PrimExpr):
                        self._checks(c, guard, out)
        if isinstance(e, Load) and not self._proven(e.buffer, e.index):
            out.append(self._check(e.buffer, e.index, guard, "read"))

    def _check(self, buffer, index, guard, what):
        cond = _in_bounds(buffer, index)
        if guard is not None:
            cond = Select(guard, cond, const(True))
        size = buffer.size
        message = (f"index out of bounds: {what} {buffer.name}[{Printer().expr(index)}] "
                   f"outside [0, {size})")
        return cond, message

    def _wrap(self, checks, stmt):
        for cond, message in reversed(checks):
            stmt = AssertStmt(cond, message, ERR_OUT_OF_BOUNDS, stmt)
        return stmt

    def visit_For(self, s):
        known = isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)
        if known:
            self.ranges[s.var] = (s.min.value, s.min.value + s.extent.value - 1)
        body = self.visit(s.body)
        self.ranges.pop(s.var, None)
        checks: list = []
        self._checks(s.extent, None, checks)
        loop = For(s.var, s.min, s.extent, s.kind, body)
        return self._wrap(checks, loop)

    def visit_Store(self, s):
        checks: list = []
        self._checks(s.value, None, checks)
        self._checks(s.index, None, checks)
        if not self._proven(s.buffer, s.index):
            checks.append(self._check(s.buffer, s.index, None, "write"))
        return self._wrap(checks, s)

    def visit_IfThenElse(self, s):
        checks: list = []
        self._checks(s.condition, None, checks)
        return self._wrap(checks, IfThenElse(s.condition, self.visit(s.then_case),
                                             self.visit(s.else_case)))

    def visit_LetStmt(self, s):
        checks: list = []
        self._checks(s.value, None, checks)
        return self._wrap(checks, LetStmt(s.var, s.value, self.visit(s.body)))


def instrument_bound_checkers(func):
    return func.with_body(_Instrumenter().visit(func.body))
