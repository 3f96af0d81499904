"""A reference interpreter for the loop IR: translates a PrimFunc to Python over numpy.

Independent of code generation, it checks lowering on small shapes: every access is
bounds-checked (``IROutOfBounds``), float scratch buffers start as NaN so a read of
a value never produced shows up in the result, and float32 math stays float32.
Parallel and vectorized loops run serially / as numpy vectors.
"""
from __future__ import annotations

import math

import numpy as np

from .expr import (EQ, GE, GT, LE, LT, NE, Add, And, Call, Cast, Div, FloatImm, FloorDiv, FloorMod,
                   IntImm, Let, Max, Min, Mod, Mul, Not, Or, Select, Sub, Var, dtype_element,
                   dtype_lanes, is_bool, is_float, is_int, wrap_int)
from .ir import (Allocate, AssertStmt, Broadcast, Buffer, Evaluate, ExternCall, For, IfThenElse,
                 LetStmt, Load, Prefetch, PrimFunc, Ramp, SeqStmt, Store, substitute)
from .lower.arith import exact_bound, fits, simplify


class IROutOfBounds(IndexError):
    """The IR read or wrote outside a buffer."""


class InterpError(ValueError):
    """Arguments do not match the function's parameters."""


def _np_dtype(dtype: str):
    elem = dtype_element(dtype)
    return np.bool_ if elem == "bool" else np.dtype(elem).type


def _check(buf, name, idx):
    lo, hi = (idx, idx) if np.ndim(idx) == 0 else (idx.min(), idx.max())
    if lo < 0 or hi >= buf.size:
        raise IROutOfBounds(f"{name}[{lo}..{hi}] outside [0, {buf.size})")


def _ld(buf, name, idx, mask=None):
    if mask is None:
        _check(buf, name, idx)
        return buf[idx]
    if np.any(mask):
        _check(buf, name, idx[mask])
    return buf[np.where(mask, idx, 0)]


def _st(buf, name, idx, value):
    _check(buf, name, idx)
    buf[idx] = value


def _tdiv(a, b):
    """C's truncating division from floor division (no abs(): abs(INT_MIN) wraps)."""
    q = a // b
    up = (a % b != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
    return np.where(up, q + 1, q).astype(np.result_type(q))[()]


def _wrap(value, dtype: str):
    return type(value)(wrap_int(int(value), dtype))


def _icast(value, dtype: str):
    """A scalar converted to an integer dtype the way the machine does it (wrapping)."""
    if isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            return _np_dtype(dtype)(0)
        value = int(value)          # truncation toward zero
    return _np_dtype(dtype)(wrap_int(int(value), dtype))


def _tmod(a, b):
    return a - b * _tdiv(a, b)


def _vselect(c, true_fn, false_fn, mask):
    """Vector select that reads memory only in the lanes each branch is selected for."""
    c = np.asarray(c)
    t_mask = c if mask is None else c & mask
    f_mask = ~c if mask is None else ~c & mask
    return np.where(c, true_fn(t_mask), false_fn(f_mask))


_BIN = {Add: "+", Sub: "-", Mul: "*", FloorDiv: "//", FloorMod: "%",
        LT: "<", LE: "<=", GT: ">", GE: ">=", EQ: "==", NE: "!="}
_MATH = {"exp": "np.exp", "exp2": "np.exp2", "log": "np.log", "log2": "np.log2",
         "log10": "np.log10", "sqrt": "np.sqrt", "tanh": "np.tanh", "sin": "np.sin",
         "cos": "np.cos", "fabs": "np.abs", "floor": "np.floor", "ceil": "np.ceil",
         "round": "np.round", "trunc": "np.trunc", "pow": "np.power", "exp10": "_exp10",
         "log1p": "np.log1p", "sinh": "np.sinh", "cosh": "np.cosh", "tan": "np.tan",
         "asin": "np.arcsin", "acos": "np.arccos", "atan": "np.arctan", "erf": "_erf",
         "nearbyint": "np.rint", "atan2": "np.arctan2", "hypot": "np.hypot",
         "copysign": "np.copysign", "fmod": "np.fmod", "ldexp": "np.ldexp", "nextafter": "np.nextafter",
         "isnan": "np.isnan", "isinf": "np.isinf", "isfinite": "np.isfinite",
         "clz": "_clz", "popcount": "_popcount"}


def _exp10(x):
    return np.power(np.asarray(x).dtype.type(10), x)


def _erf(x):
    x = np.asarray(x)
    return np.vectorize(math.erf, otypes=[x.dtype])(x)[()]


def _unsigned_bits(x):
    x = np.asarray(x)
    return x.view(f"uint{x.dtype.itemsize * 8}"), x.dtype.itemsize * 8


def _clz(x):
    u, bits = _unsigned_bits(x)
    out = np.vectorize(lambda v: bits - int(v).bit_length(), otypes=[np.asarray(x).dtype])(u)
    return out[()]


def _popcount(x):
    u, _ = _unsigned_bits(x)
    return np.bitwise_count(u).astype(np.asarray(x).dtype)[()]


class _PyGen:
    def __init__(self):
        self.names: dict = {}
        self.lines: list = []
        self.consts: dict = {}
        self.mask = "None"      # name of the lane mask of the enclosing vector select
        self.masks = 0
        self.ranges: dict = {}  # loop variable -> (lo, hi) while its body is emitted

    def name(self, obj, prefix: str) -> str:
        key = id(obj)
        if key not in self.names:
            self.names[key] = (f"{prefix}{len(self.names)}", obj)
        return self.names[key][0]

    def const(self, value) -> str:
        n = f"k{len(self.consts)}"
        self.consts[n] = value
        return n

    # ------------------------------------------------------------------ expressions
    def expr(self, e) -> str:
        if isinstance(e, Var):
            return self.name(e, "v")
        if isinstance(e, IntImm):
            return repr(bool(e.value)) if is_bool(e.dtype) else repr(e.value)
        if isinstance(e, FloatImm):
            return self.const(_np_dtype(e.dtype)(e.value))
        if type(e) in _BIN:
            text = f"({self.expr(e.a)} {_BIN[type(e)]} {self.expr(e.b)})"
            if isinstance(e, (Add, Sub, Mul)) and is_int(e.dtype) and dtype_lanes(e.dtype) == 1 \
                    and not fits(exact_bound(e, self.ranges), e.dtype):
                return f"_wrap({text}, {e.dtype!r})"     # Python ints do not wrap by themselves
            return text
        if isinstance(e, Div):
            if is_float(e.dtype):
                return f"({self.expr(e.a)} / {self.expr(e.b)})"
            return f"_tdiv({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, Mod):
            return f"_tmod({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, (Min, Max)):
            if is_int(e.dtype) and dtype_lanes(e.dtype) == 1:  # exact on Python ints beyond int64
                fn = "min" if isinstance(e, Min) else "max"
            else:
                fn = "np.minimum" if isinstance(e, Min) else "np.maximum"
            return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, (And, Or)):
            fn = "np.logical_and" if isinstance(e, And) else "np.logical_or"
            return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, Not):
            return f"np.logical_not({self.expr(e.a)})"
        if isinstance(e, Select):
            return self.select(e)
        if isinstance(e, Cast):
            t = self.const(_np_dtype(e.dtype))
            v = self.expr(e.value)
            if dtype_lanes(e.dtype) > 1:
                return f"np.asarray({v}).astype({t})"
            if is_float(e.dtype) or is_bool(e.dtype):
                return f"{t}({v})"
            return f"_icast({v}, {e.dtype!r})"
        if isinstance(e, ExternCall):
            raise InterpError(f"the interpreter cannot call the C function {e.name} "
                              "(call_extern): build the module and run it")
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args]
            if e.op == "all_lanes":
                return f"bool(np.all({args[0]}))"
            if e.op == "interleave":
                return f"np.stack([{', '.join(args)}], axis=-1).reshape(-1)"
            if e.op == "fma":
                return f"({args[0]} * {args[1]} + {args[2]})"
            return f"{_MATH[e.op]}({', '.join(args)})"
        if isinstance(e, Let):
            return f"(lambda {self.expr(e.var)}: {self.expr(e.body)})({self.expr(e.value)})"
        if isinstance(e, Ramp):
            return f"({self.expr(e.base)} + np.arange({e.lanes}) * {self.expr(e.stride)})"
        if isinstance(e, Broadcast):
            t = self.const(_np_dtype(e.dtype))
            return f"np.full({e.lanes}, {self.expr(e.value)}, dtype={t})"
        if isinstance(e, Load):
            b = self.name(e.buffer, "b")
            return f"_ld({b}, {e.buffer.name!r}, {self.expr(e.index)}, {self.mask})"
        raise InterpError(f"cannot interpret {type(e).__name__}")

    def select(self, e) -> str:
        """Lazy like TVM's if_then_else: the branch not taken never touches memory."""
        cond = self.expr(e.condition)
        if dtype_lanes(e.dtype) == 1:
            return f"({self.expr(e.true_value)} if {cond} else {self.expr(e.false_value)})"
        outer = self.mask
        branches = []
        for branch in (e.true_value, e.false_value):
            self.masks += 1
            self.mask = f"m{self.masks}"
            branches.append(f"lambda {self.mask}: {self.expr(branch)}")
            self.mask = outer
        return f"_vselect({cond}, {branches[0]}, {branches[1]}, {outer})"

    # ------------------------------------------------------------------ statements
    def stmt(self, s, ind: str) -> None:
        if s is None:
            self.lines.append(f"{ind}pass")
        elif isinstance(s, SeqStmt):
            for x in s.seq:
                self.stmt(x, ind)
        elif isinstance(s, Store):
            b = self.name(s.buffer, "b")
            self.lines.append(f"{ind}_st({b}, {s.buffer.name!r}, {self.expr(s.index)}, "
                              f"{self.expr(s.value)})")
        elif isinstance(s, For):
            lo = self.expr(s.min)
            self.lines.append(f"{ind}for {self.expr(s.var)} in range({lo}, {lo} + "
                              f"{self.expr(s.extent)}):")
            known = isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)
            outer = self.ranges.get(s.var)
            if known:
                self.ranges[s.var] = (s.min.value, s.min.value + s.extent.value - 1)
            self.stmt(s.body, ind + " ")
            self.ranges.pop(s.var, None)
            if outer is not None:
                self.ranges[s.var] = outer
        elif isinstance(s, Allocate):
            b = self.name(s.buffer, "b")
            t = self.const(_np_dtype(s.buffer.dtype))
            fill = "np.nan" if is_float(s.buffer.dtype) else "0"
            self.lines.append(f"{ind}{b} = np.full(int({self.expr(_size(s.buffer))}), {fill}, "
                              f"dtype={t})")
            self.stmt(s.body, ind)
        elif isinstance(s, IfThenElse):
            self.lines.append(f"{ind}if {self.expr(s.condition)}:")
            self.stmt(s.then_case, ind + " ")
            if s.else_case is not None:
                self.lines.append(f"{ind}else:")
                self.stmt(s.else_case, ind + " ")
        elif isinstance(s, LetStmt):
            self.lines.append(f"{ind}{self.expr(s.var)} = {self.expr(s.value)}")
            self.stmt(s.body, ind)
        elif isinstance(s, Prefetch):
            self.lines.append(f"{ind}pass  # prefetch")
        elif isinstance(s, AssertStmt):
            self.lines.append(f"{ind}if not {self.expr(s.condition)}:")
            self.lines.append(f"{ind} raise IROutOfBounds({s.message!r})")
            self.stmt(s.body, ind)
        elif isinstance(s, Evaluate):
            self.lines.append(f"{ind}{self.expr(s.value)}")
        else:
            raise InterpError(f"cannot interpret {type(s).__name__}")


def _size(buf: Buffer):
    size = buf.size
    return IntImm(size) if isinstance(size, int) else size


def compile_func(func: PrimFunc):
    """Python callable ``f(*args)`` running ``func`` on numpy arrays (and ints)."""
    gen = _PyGen()
    params = [gen.name(p, "b" if isinstance(p, Buffer) else "v") for p in func.params]
    gen.stmt(func.body, " ")
    src = f"def {func.name}({', '.join(params)}):\n" + "\n".join(gen.lines) + "\n"
    env = {"np": np, "_ld": _ld, "_st": _st, "_tdiv": _tdiv, "_tmod": _tmod,
           "_vselect": _vselect, "_icast": _icast, "_wrap": _wrap, "_exp10": _exp10, "_erf": _erf,
           "_clz": _clz, "_popcount": _popcount, "IROutOfBounds": IROutOfBounds, **gen.consts}
    exec(compile(src, f"<interp {func.name}>", "exec"), env)  # noqa: S102 - our own IR
    return env[func.name], src


def run(func: PrimFunc, *args) -> None:
    """Run ``func`` on numpy arrays (written in place) and ints for scalar parameters."""
    if len(args) != len(func.params):
        raise InterpError(f"{func.name} takes {len(func.params)} arguments, got {len(args)}")
    fn, _ = compile_func(func)
    flat = []
    env: dict = {}
    for p, a in zip(func.params, args):
        if isinstance(p, Buffer):
            if not isinstance(a, np.ndarray) or a.dtype != np.dtype(_np_dtype(p.dtype)):
                raise InterpError(f"{p.name}: expected a numpy array of {p.dtype}")
            if not a.flags.c_contiguous:
                raise InterpError(f"{p.name}: array must be C-contiguous")
            flat.append(a.reshape(-1))
        else:
            env[p] = IntImm(int(a), p.dtype)
            flat.append(int(a))
    for p, a in zip(func.params, flat):
        if isinstance(p, Buffer):
            size = simplify(substitute(_size(p), env))
            if not isinstance(size, IntImm) or size.value != a.size:
                raise InterpError(f"{p.name}: expected {size} elements, got {a.size}")
    with np.errstate(over="ignore"):    # integer arithmetic wraps, as in compiled code
        fn(*flat)
