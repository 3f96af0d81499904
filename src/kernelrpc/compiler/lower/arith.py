"""Integer arithmetic: linear canonical form, interval bounds and expression simplification.

Loop variables have known ranges, so index expressions such as
``floordiv(no*32 + ni, 32)`` with ``0 <= ni < 32`` fold to ``no``; that is what turns
packed-layout accesses into contiguous ``Ramp``s after vectorization.
"""
from __future__ import annotations

import math

import numpy as np

from ..expr import (EQ, GE, GT, LE, LT, NE, Add, And, Cast, CmpOp, Div, FloatImm, FloorDiv,
                    FloorMod, IntImm, Max, Min, Mod, Mul, Not, Or, PrimExpr, Select, Sub, Var,
                    dtype_lanes, int_range, is_bool, is_float, is_int)
from ..ir import Broadcast, BufferPointer, ExternCall, Mutator

INF = math.inf


def skey(e):
    """A hashable structural key: equal keys mean the same expression."""
    if isinstance(e, Var):
        return ("Var", id(e))
    if isinstance(e, (IntImm, FloatImm)):
        return (type(e).__name__, e.value, e.dtype)
    if isinstance(e, ExternCall):       # not pure: two calls are two values
        return ("ExternCall", id(e))
    parts = [type(e).__name__, e.dtype]
    for name in e._fields:
        v = getattr(e, name)
        if isinstance(v, PrimExpr):
            parts.append(skey(v))
        elif isinstance(v, tuple):
            parts.append(tuple(skey(x) if isinstance(x, PrimExpr) else id(x) for x in v))
        elif isinstance(v, (str, int, float)) or v is None:
            parts.append(v)
        else:
            parts.append(id(v))
    return tuple(parts)


def is_index(e: PrimExpr) -> bool:
    return is_int(e.dtype) and dtype_lanes(e.dtype) == 1


# --------------------------------------------------------------------------- linear form

def linear(e: PrimExpr):
    """``e`` as ({key: [atom, coeff]}, const) over non-linear atoms (Vars, floordivs, ...)."""
    terms: dict = {}
    const = 0
    stack = [(e, 1)]
    while stack:
        x, c = stack.pop()
        if isinstance(x, IntImm):
            const += c * x.value
        elif isinstance(x, Add):
            stack += [(x.b, c), (x.a, c)]
        elif isinstance(x, Sub):
            stack += [(x.b, -c), (x.a, c)]
        elif isinstance(x, Mul) and isinstance(x.b, IntImm):
            stack.append((x.a, c * x.b.value))
        elif isinstance(x, Mul) and isinstance(x.a, IntImm):
            stack.append((x.b, c * x.a.value))
        else:
            k = skey(x)
            if k in terms:
                terms[k][1] += c
            else:
                terms[k] = [x, c]
    return {k: v for k, v in terms.items() if v[1] != 0}, const


def merge_div_mod(terms: dict, const: int):
    """``c*a*(x // c) + a*(x % c)`` -> ``a*x`` (floor division by a positive constant, exact
    for every integer): the index of a fused axis, ``y*W + x`` with ``y = p // W`` and
    ``x = p % W``, is ``p`` again, so a vector along ``p`` is a contiguous ``Ramp``."""
    for key, (atom, coeff) in list(terms.items()):
        if not (isinstance(atom, FloorMod) and isinstance(atom.b, IntImm) and atom.b.value > 0):
            continue
        div = terms.get(skey(FloorDiv(atom.a, atom.b)))
        if key not in terms or div is None or div[1] != coeff * atom.b.value:
            continue
        del terms[key], terms[skey(div[0])]
        inner, inner_const = linear(atom.a)
        const += coeff * inner_const
        for k, (a, c) in inner.items():
            merged = terms.setdefault(k, [a, 0])
            merged[1] += coeff * c
            if merged[1] == 0:
                del terms[k]
    return terms, const


def from_linear(terms: dict, const: int, dtype: str) -> PrimExpr:
    items = sorted(terms.values(), key=lambda t: -abs(t[1]))
    out = None
    for atom, c in items:
        mag = abs(c)
        term = atom if mag == 1 else Mul(atom, IntImm(mag, dtype))
        if out is None:
            out = term if c > 0 else (Mul(atom, IntImm(c, dtype)) if c != -1
                                      else Sub(IntImm(0, dtype), atom))
        else:
            out = Add(out, term) if c > 0 else Sub(out, term)
    if out is None:
        return IntImm(const, dtype)
    if const > 0:
        out = Add(out, IntImm(const, dtype))
    elif const < 0:
        out = Sub(out, IntImm(-const, dtype))
    return out


# --------------------------------------------------------------------------- bounds

def _fdiv(x, c):
    if x in (INF, -INF):
        return x if c > 0 else -x
    return x // c


def _mul(a, b):
    if a == 0 or b == 0:
        return 0
    return a * b


def bound(e: PrimExpr, ranges: dict) -> tuple:
    """Inclusive (lo, hi) of the value the machine computes for a scalar integer expression.

    Sound for wrapping arithmetic: a node whose exact result may leave its dtype's range
    (and so wrap) gets the whole range of the dtype. Unknown values (loads, parameters)
    get their dtype's range; non-integer expressions (-inf, inf).
    """
    if isinstance(e, IntImm):
        return e.value, e.value
    if not _is_int_like(e.dtype):
        return -INF, INF
    return _clamp(exact_bound(e, ranges), e.dtype)


def _is_int_like(dtype: str) -> bool:
    return dtype_lanes(dtype) == 1 and (is_int(dtype) or is_bool(dtype))


def _clamp(lo_hi: tuple, dtype: str) -> tuple:
    lo, hi = lo_hi
    d_lo, d_hi = int_range(dtype)
    if d_lo <= lo and hi <= d_hi:
        return lo, hi
    return d_lo, d_hi


def fits(lo_hi: tuple, dtype: str) -> bool:
    """The interval lies inside the dtype's range (nothing in it wraps)."""
    d_lo, d_hi = int_range(dtype)
    return d_lo <= lo_hi[0] and lo_hi[1] <= d_hi


def exact_bound(e, ranges):
    """The interval of the exact (unbounded) result of ``e``'s top operation."""
    if isinstance(e, Var):
        return ranges.get(e, int_range(e.dtype))
    if isinstance(e, Add):
        (a0, a1), (b0, b1) = bound(e.a, ranges), bound(e.b, ranges)
        return a0 + b0, a1 + b1
    if isinstance(e, Sub):
        (a0, a1), (b0, b1) = bound(e.a, ranges), bound(e.b, ranges)
        return a0 - b1, a1 - b0
    if isinstance(e, Mul):
        (a0, a1), (b0, b1) = bound(e.a, ranges), bound(e.b, ranges)
        prods = [_mul(x, y) for x in (a0, a1) for y in (b0, b1)]
        return min(prods), max(prods)
    if isinstance(e, (FloorDiv, FloorMod, Div, Mod)) and isinstance(e.b, IntImm) and e.b.value:
        c = e.b.value
        lo, hi = bound(e.a, ranges)
        floor_ok = isinstance(e, (FloorDiv, FloorMod)) or lo >= 0
        if isinstance(e, (FloorDiv, Div)) and floor_ok:
            q = (_fdiv(lo, c), _fdiv(hi, c))
            return min(q), max(q)
        if isinstance(e, (FloorMod, Mod)) and floor_ok and c > 0:
            if lo != -INF and hi != INF and lo // c == hi // c:
                return lo % c, hi % c
            return 0, c - 1
        return -INF, INF
    if isinstance(e, (Min, Max)):
        (a0, a1), (b0, b1) = bound(e.a, ranges), bound(e.b, ranges)
        f = min if isinstance(e, Min) else max
        return f(a0, b0), f(a1, b1)
    if isinstance(e, Select):
        (a0, a1), (b0, b1) = bound(e.true_value, ranges), bound(e.false_value, ranges)
        return min(a0, b0), max(a1, b1)
    if isinstance(e, Cast) and _is_int_like(e.value.dtype):
        return bound(e.value, ranges)
    return int_range(e.dtype)


def linear_bound(terms: dict, const: int, ranges: dict) -> tuple:
    """Exact interval of a linear form over atoms with the given (machine) ranges."""
    lo = hi = const
    for atom, c in terms.values():
        a0, a1 = bound(atom, ranges)
        lo += min(_mul(c, a0), _mul(c, a1))
        hi += max(_mul(c, a0), _mul(c, a1))
    return lo, hi


def exact_linear(e: PrimExpr, ranges: dict):
    """``linear(e)`` when the machine value of ``e`` provably equals it, else None.

    Add, Sub and Mul by a constant wrap consistently (two's complement is a ring), so the
    machine value is the linear form's exact value modulo 2**bits; it is that value itself
    exactly when the whole form's interval fits the dtype. A signed variable without a
    known range (a symbolic shape, a loop variable outside its loop) is index arithmetic
    and assumed not to overflow, as in TVM; values loaded from memory never are.
    """
    terms, const = linear(e)
    lo = hi = const
    for atom, c in terms.values():
        if isinstance(atom, Var) and atom not in ranges and atom.dtype in ("int32", "int64"):
            continue
        a0, a1 = bound(atom, ranges)
        lo += min(_mul(c, a0), _mul(c, a1))
        hi += max(_mul(c, a0), _mul(c, a1))
    if not fits((lo, hi), e.dtype):
        return None
    return terms, const


# --------------------------------------------------------------------------- rewriting

_INT_FOLD = {
    Add: lambda a, b: a + b, Sub: lambda a, b: a - b, Mul: lambda a, b: a * b,
    FloorDiv: lambda a, b: a // b, FloorMod: lambda a, b: a % b,
    Div: lambda a, b: abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1),
    Mod: lambda a, b: a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)),
    Min: min, Max: max,
}
_CMP_FOLD = {LT: lambda a, b: a < b, LE: lambda a, b: a <= b, GT: lambda a, b: a > b,
             GE: lambda a, b: a >= b, EQ: lambda a, b: a == b, NE: lambda a, b: a != b}
_NP_FLOAT = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def _true(v: bool) -> IntImm:
    return IntImm(1 if v else 0, "bool")


def _is_const(e, value=None) -> bool:
    return isinstance(e, (IntImm, FloatImm)) and (value is None or e.value == value)


def _fold_float(e):
    a, b = e.a, e.b
    np_t = _NP_FLOAT.get(e.dtype)
    if np_t is None or not (_is_const(a) and _is_const(b)):
        return None
    x, y = np_t(a.value), np_t(b.value)
    with np.errstate(all="ignore"):
        if isinstance(e, Add):
            return FloatImm(float(x + y), e.dtype)
        if isinstance(e, Sub):
            return FloatImm(float(x - y), e.dtype)
        if isinstance(e, Mul):
            return FloatImm(float(x * y), e.dtype)
        if isinstance(e, Div) and y != 0:
            return FloatImm(float(x / y), e.dtype)
        if isinstance(e, (Min, Max)):
            return FloatImm(float(min(x, y) if isinstance(e, Min) else max(x, y)), e.dtype)
    return None


def _div_mod(e, ranges):
    """floordiv / floormod (or trunc div/mod of a non-negative) by a positive constant.

    The identities (``(q*c + r) // c == q + r // c``) hold for exact integers, so they are
    used only when the dividend provably does not wrap.
    """
    c = e.b.value
    lo, hi = bound(e.a, ranges)
    if isinstance(e, (Div, Mod)) and lo < 0:
        return e
    is_div = isinstance(e, (FloorDiv, Div))
    if c == 1:
        return e.a if is_div else IntImm(0, e.dtype)
    inner = e.a
    d_lo, d_hi = int_range(e.dtype)
    if (isinstance(inner, FloorDiv) and is_div and isinstance(inner.b, IntImm)
            and 0 < inner.b.value and inner.b.value * c <= d_hi):
        return _div_mod(FloorDiv(inner.a, IntImm(inner.b.value * c, e.dtype)), ranges)
    if (isinstance(inner, FloorMod) and not is_div and isinstance(inner.b, IntImm)
            and inner.b.value > 0 and inner.b.value % c == 0):
        return _div_mod(FloorMod(inner.a, e.b), ranges)
    form = exact_linear(inner, ranges)
    if form is None:
        return e
    terms, k = form
    q_terms, r_terms = {}, {}
    for key, (atom, coeff) in terms.items():
        if coeff % c == 0:
            q_terms[key] = [atom, coeff // c]
        else:
            r_terms[key] = [atom, coeff]
    qk, rk = divmod(k, c)
    r_lo, r_hi = linear_bound(r_terms, rk, ranges)
    same_block = r_lo // c == r_hi // c
    if is_div:
        if same_block:
            return from_linear(q_terms, qk + r_lo // c, e.dtype)
        if not r_terms:
            return from_linear(q_terms, qk, e.dtype)
    elif same_block:
        return from_linear(r_terms, rk - (r_lo // c) * c, e.dtype)
    blocked = _common_block(r_terms, rk, c, ranges, e.dtype)
    if blocked is not None:
        g, outer, small_terms, small_k = blocked
        if is_div:
            part = _div_mod(FloorDiv(outer, IntImm(c // g, e.dtype)), ranges)
            q_terms[skey(part)] = [part, 1]
            return from_linear(q_terms, qk, e.dtype)
        part = _div_mod(FloorMod(outer, IntImm(c // g, e.dtype)), ranges)
        small_terms[skey(part)] = [part, g]
        return from_linear(small_terms, small_k, e.dtype)
    if not fits((r_lo, r_hi), e.dtype):
        return e
    rest = from_linear(r_terms, rk, e.dtype)
    if not is_div:
        return FloorMod(rest, e.b)
    q_terms[skey(rest)] = [FloorDiv(rest, e.b), 1]
    return from_linear(q_terms, qk, e.dtype)


def _common_block(terms: dict, k: int, c: int, ranges: dict, dtype: str):
    """``terms + k`` as ``g * outer + small`` with ``g`` dividing ``c`` and ``0 <= small < g``,
    or None: then ``(g*outer + small) // c == outer // (c/g)`` and
    ``(g*outer + small) % c == g * (outer % (c/g)) + small`` (a tile of ``g`` channels inside
    one group of ``c``: ``(fo*8 + fi) // 136 == fo // 17`` for ``0 <= fi < 8``)."""
    for g in sorted({math.gcd(coeff, c) for _, coeff in terms.values()} - {1, c}, reverse=True):
        big = {key: [atom, coeff // g] for key, (atom, coeff) in terms.items() if coeff % g == 0}
        small = {key: [atom, coeff] for key, (atom, coeff) in terms.items() if coeff % g}
        if not big:
            continue
        small_k = k % g
        lo, hi = linear_bound(small, small_k, ranges)
        if 0 <= lo and hi < g:
            return g, from_linear(big, k // g, dtype), small, small_k
    return None


def rewrite(e: PrimExpr, ranges: dict) -> PrimExpr:
    """One simplification step for a node whose children are already simplified."""
    if isinstance(e, CmpOp):
        return _rewrite_cmp(e, ranges)
    if isinstance(e, (Add, Sub, Mul, Div, Mod, FloorDiv, FloorMod, Min, Max)):
        a, b = e.a, e.b
        if is_float(e.dtype):
            folded = _fold_float(e)
            if folded is not None:
                return folded
            if isinstance(e, (Add, Sub)) and _is_const(b, 0.0):
                return a
            if isinstance(e, Add) and _is_const(a, 0.0):
                return b
            if isinstance(e, (Mul, Div)) and _is_const(b, 1.0):
                return a
            if isinstance(e, Mul) and _is_const(a, 1.0):
                return b
            return e
        if not is_index(e):
            return e
        if isinstance(a, IntImm) and isinstance(b, IntImm):
            if isinstance(e, (Div, Mod, FloorDiv, FloorMod)) and b.value == 0:
                return e
            return IntImm(_INT_FOLD[type(e)](a.value, b.value), e.dtype)
        if isinstance(e, (Add, Sub, Mul)):
            return from_linear(*merge_div_mod(*linear(e)), e.dtype)
        if isinstance(e, (Div, Mod, FloorDiv, FloorMod)):
            if isinstance(b, IntImm) and b.value > 0:
                return _div_mod(e, ranges)
            return e
        lo, hi = difference_bound(a, b, ranges)
        if hi <= 0:
            return a if isinstance(e, Min) else b
        if lo >= 0:
            return b if isinstance(e, Min) else a
        return e
    if isinstance(e, (And, Or)):
        # a constant operand decides: the identity (True for &&) leaves the other operand,
        # the absorbing value (False for &&) is the result
        identity = isinstance(e, And)
        for const, other in ((e.a, e.b), (e.b, e.a)):
            if _is_const(const):
                return other if bool(const.value) == identity else const
        return e
    if isinstance(e, Not) and _is_const(e.a):
        return _true(not e.a.value)
    if isinstance(e, Select) and _is_const(e.condition):
        return e.true_value if e.condition.value else e.false_value
    if isinstance(e, Cast) and _is_const(e.value) and dtype_lanes(e.dtype) == 1:
        v = e.value.value
        if is_float(e.dtype):
            return FloatImm(float(_NP_FLOAT[e.dtype](v)), e.dtype)
        if is_bool(e.dtype):
            return _true(v != 0)
        if isinstance(v, float) and not math.isfinite(v):
            return e
        return IntImm(int(v), e.dtype)
    if isinstance(e, Broadcast) and e.lanes == 1:
        return e.value
    return e


def difference_bound(a: PrimExpr, b: PrimExpr, ranges: dict) -> tuple:
    """Interval of the exact difference of the machine values of ``a`` and ``b``."""
    fa, fb = exact_linear(a, ranges), exact_linear(b, ranges)
    if fa is not None and fb is not None:
        terms, k = linear(Sub(a, b))
        return linear_bound(terms, k, ranges)
    (a0, a1), (b0, b1) = bound(a, ranges), bound(b, ranges)
    return a0 - b1, a1 - b0


def _rewrite_cmp(e, ranges):
    """Decide a comparison from bounds, else move constants to the right-hand side.

    ``a < b`` becomes ``terms < c`` only where that is an identity of the machine's
    arithmetic: both sides and the new left-hand side provably do not wrap. (For unsigned
    types ``a - b`` is never negative, so ``a < b`` must not become ``a - b < 0``.)
    """
    a, b = e.a, e.b
    if _is_const(a) and _is_const(b):
        return _true(_CMP_FOLD[type(e)](a.value, b.value))
    if not is_index(a):
        return e
    lo, hi = difference_bound(a, b, ranges)
    decided = {
        LT: (hi < 0, lo >= 0), LE: (hi <= 0, lo > 0), GT: (lo > 0, hi <= 0),
        GE: (lo >= 0, hi < 0), EQ: (lo == hi == 0, hi < 0 or lo > 0),
        NE: (hi < 0 or lo > 0, lo == hi == 0),
    }[type(e)]
    if decided[0]:
        return _true(True)
    if decided[1]:
        return _true(False)
    if exact_linear(a, ranges) is None or exact_linear(b, ranges) is None:
        return e
    terms, k = linear(Sub(a, b))
    dtype = a.dtype
    if all(c < 0 for _, c in terms.values()):
        negated = {key: [t, -c] for key, (t, c) in terms.items()}
        if fits((k, k), dtype) and fits(linear_bound(negated, 0, ranges), dtype):
            return type(e)(IntImm(k, dtype), from_linear(negated, 0, dtype))
    elif fits((-k, -k), dtype) and fits(linear_bound(terms, 0, ranges), dtype):
        return type(e)(from_linear(terms, 0, dtype), IntImm(-k, dtype))
    return e


class Simplifier(Mutator):
    """Simplify expressions bottom-up, knowing the ranges of enclosing loop variables."""

    def __init__(self, ranges: dict | None = None):
        self.ranges = dict(ranges or {})

    def visit(self, node):
        if isinstance(node, PrimExpr):
            if isinstance(node, (Var, IntImm, FloatImm)):
                return node
            if isinstance(node, (ExternCall, BufferPointer)):
                return self.generic_visit(node)     # only their arguments simplify
            return rewrite(self.generic_visit(node), self.ranges)
        return super().visit(node)


def conjuncts(cond) -> list:
    """``a && (b && c)`` -> ``[a, b, c]``."""
    if isinstance(cond, And):
        return conjuncts(cond.a) + conjuncts(cond.b)
    return [cond]


def and_all(conds):
    """The conjunction of a non-empty list of conditions."""
    out = conds[0]
    for c in conds[1:]:
        out = And(out, c)
    return out


def simplify(e: PrimExpr, ranges: dict | None = None) -> PrimExpr:
    return Simplifier(ranges).visit(e)


def const_int(e):
    """The int value of ``e`` if it simplifies to a constant, else None."""
    if isinstance(e, int):
        return e
    e = simplify(e)
    return e.value if isinstance(e, IntImm) else None
