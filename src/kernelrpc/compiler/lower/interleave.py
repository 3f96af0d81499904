"""InterleaveStores: ``k`` vector stores that together write one contiguous run, lane by lane
in turn, become one contiguous store of their values interleaved.

After vectorizing along one axis and unrolling an inner axis of extent ``k`` (the quads of
an int8 layer's input: 4 channels' bytes side by side), the unrolled copies store
``buf[ramp(b + j, k, L)] = v_j`` for ``j = 0..k-1``: each a scatter of ``L`` lanes,
element by element in the generated code. Together they write ``buf[b .. b + k*L)``, so they
are one store of ``interleave(v_0, ..., v_{k-1})`` (lane ``k*l + j`` is ``v_j``'s lane
``l``), which the code generator emits as a contiguous store of one shuffle.
"""
from __future__ import annotations

from ..expr import Call, IntImm, with_lanes
from ..ir import ExternCall, Load, Mutator, Ramp, Store, post_order_visit, seq
from .arith import simplify

#: the most stores merged into one (4: an int8 quad; wider groups are not produced)
MAX_WAYS = 4


def _reads(value, buffer) -> bool:
    """Whether evaluating ``value`` could see a store to ``buffer``: it loads from it, or
    calls a C function (which may read or write anything)."""
    found = []
    post_order_visit(value, lambda n: found.append(n) if isinstance(n, ExternCall) or (
        isinstance(n, Load) and n.buffer is buffer) else None)
    return bool(found)


def _offset(a, b) -> int | None:
    """``b - a`` where it is a constant."""
    diff = simplify(b - a)
    return diff.value if isinstance(diff, IntImm) else None


def _group(stmts, start: int):
    """The stores from ``start`` that interleave into one run, or None."""
    first = stmts[start]
    if not (isinstance(first, Store) and isinstance(first.index, Ramp)
            and isinstance(first.index.stride, IntImm)):
        return None
    ways, lanes = first.index.stride.value, first.index.lanes
    if not 2 <= ways <= MAX_WAYS or start + ways > len(stmts):
        return None
    group = stmts[start:start + ways]
    for j, store in enumerate(group):
        if not (isinstance(store, Store) and store.buffer is first.buffer
                and isinstance(store.index, Ramp) and store.index.lanes == lanes
                and isinstance(store.index.stride, IntImm)
                and store.index.stride.value == ways
                and store.value.dtype == first.value.dtype
                and _offset(first.index.base, store.index.base) == j
                and not _reads(store.value, first.buffer)):
            return None
    return group


class _Interleaver(Mutator):
    def visit_SeqStmt(self, s):
        stmts = [self.visit(x) for x in s.seq]
        out, i = [], 0
        while i < len(stmts):
            group = _group(stmts, i)
            if group is None:
                out.append(stmts[i])
                i += 1
                continue
            first = group[0]
            ways, lanes = len(group), first.index.lanes
            value = Call(with_lanes(first.value.dtype, ways * lanes), "interleave",
                         [store.value for store in group])
            out.append(Store(first.buffer, value,
                             Ramp(first.index.base, IntImm(1, first.index.base.dtype),
                                  ways * lanes)))
            i += ways
        if len(out) == len(s.seq) and all(a is b for a, b in zip(out, s.seq)):
            return s
        return seq(*out)


def interleave_func(func):
    return func.with_body(_Interleaver().visit(func.body))
