"""Scalar and vector expressions shared by the tensor language and the loop IR.

Dtypes are strings as in TVM: ``"float32"``, ``"int32"``, ``"bool"``, and vector
types with a lane suffix, ``"float32x16"``.  Python operators on expressions build
nodes; ``//`` and ``%`` are floor division and floor modulo (TVM's semantics),
``/`` is true division for floats and truncating division for integers.
"""
from __future__ import annotations

import math
import re

_DTYPE_RE = re.compile(r"^(float|int|uint|bool)(\d*)(?:x(\d+))?$")


class DTypeError(TypeError):
    """A dtype string is malformed or two operands cannot be combined."""


#: dtype string -> its parse: lowering and code generation ask about a handful of dtypes some
#: 20 000 times per kernel (a tuning candidate of a ResNet-18 convolution); the dictionary
#: lookup takes 8% off a candidate's build
_PARSED: dict = {}


def parse_dtype(dtype: str) -> tuple[str, int, int]:
    """``"float32x16"`` -> ``("float", 32, 16)``; ``"bool"`` -> ``("bool", 1, 1)``."""
    try:
        return _PARSED[dtype]
    except (KeyError, TypeError):     # not seen yet, or not a string (unhashable)
        pass
    parsed = _parse_dtype(dtype)
    if len(_PARSED) < 4096:           # dtype strings are few; a bound against odd callers
        _PARSED[dtype] = parsed
    return parsed


def _parse_dtype(dtype: str) -> tuple[str, int, int]:
    m = _DTYPE_RE.match(dtype) if isinstance(dtype, str) else None
    if m is None:
        raise DTypeError(f"unknown dtype {dtype!r}")
    code, bits, lanes = m.group(1), m.group(2), m.group(3)
    if code == "bool":
        if bits not in ("", "1"):
            raise DTypeError(f"unknown dtype {dtype!r}")
        nbits = 1
    else:
        if not bits:
            raise DTypeError(f"dtype {dtype!r} needs a bit width")
        nbits = int(bits)
        valid = (16, 32, 64) if code == "float" else (8, 16, 32, 64)
        if nbits not in valid:
            raise DTypeError(f"unsupported bit width in dtype {dtype!r}")
    nlanes = int(lanes) if lanes else 1
    if nlanes < 1:
        raise DTypeError(f"bad lane count in dtype {dtype!r}")
    return code, nbits, nlanes


def dtype_lanes(dtype: str) -> int:
    return parse_dtype(dtype)[2]


def dtype_element(dtype: str) -> str:
    """The scalar dtype of a (possibly vector) dtype."""
    code, bits, _ = parse_dtype(dtype)
    return "bool" if code == "bool" else f"{code}{bits}"


def with_lanes(dtype: str, lanes: int) -> str:
    elem = dtype_element(dtype)
    return elem if lanes == 1 else f"{elem}x{lanes}"


def is_float(dtype: str) -> bool:
    return parse_dtype(dtype)[0] == "float"


def is_int(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return parse_dtype(dtype)[0] in ("int", "uint")


def is_bool(dtype: str) -> bool:
    return parse_dtype(dtype)[0] == "bool"


def dtype_bits(dtype: str) -> int:
    return parse_dtype(dtype)[1]


def int_range(dtype: str) -> tuple[int, int]:
    """Inclusive value range of an integer (or bool) dtype's elements."""
    code, bits, _ = parse_dtype(dtype)
    if code == "bool":
        return 0, 1
    if code == "uint":
        return 0, 2 ** bits - 1
    if code == "int":
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    raise DTypeError(f"{dtype} is not an integer dtype")


def wrap_int(value: int, dtype: str) -> int:
    """``value`` reduced to the dtype the way the machine does it (two's complement)."""
    code, bits, _ = parse_dtype(dtype)
    if code == "bool":
        return 1 if value else 0
    value &= (1 << bits) - 1
    if code == "int" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


# --------------------------------------------------------------------------- nodes

def node(cls):
    """The one way to declare an expression or statement class: by its ``_fields``.

    ``_fields`` are the constructor's parameters, in order (the traversals rebuild a node
    from them). The decorator gives the class its ``__slots__`` and, unless it writes its
    own, an ``__init__`` that stores the fields, compiled once per class so that it costs
    what a hand-written one does. Optional class attributes shape that ``__init__``:
    ``_defaults`` (values of trailing parameters), ``_tuples`` (fields stored as tuples)
    and ``_dtype_of`` (the field whose dtype is the node's). A class that computes more
    than that (a result dtype, a check) writes its ``__init__``.

    A decorator rather than a metaclass: ``isinstance`` against a class whose metaclass is
    not ``type`` takes CPython's slow path, and the passes call it on every node.
    """
    fields = cls.__dict__.get("_fields", ())
    inherited = {slot for klass in cls.__mro__[1:] for slot in getattr(klass, "__slots__", ())}
    namespace = {k: v for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    namespace["__slots__"] = tuple(f for f in fields if f not in inherited)
    new = type(cls.__name__, cls.__bases__, namespace)
    new.__qualname__ = cls.__qualname__
    if fields and "__init__" not in namespace:
        new.__init__ = _storing_init(new)
    return new


def _storing_init(cls):
    defaults = getattr(cls, "_defaults", {})
    tuples = getattr(cls, "_tuples", ())
    params = [f"{f}=_defaults[{f!r}]" if f in defaults else f for f in cls._fields]
    body = [f"self.{f} = tuple({f})" if f in tuples else f"self.{f} = {f}" for f in cls._fields]
    dtype_of = getattr(cls, "_dtype_of", None)
    if dtype_of is not None:
        body.append(f"self.dtype = {dtype_of}.dtype")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body)
    scope: dict = {"_defaults": defaults}
    exec(source, scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


class PrimExpr:
    """Base of every expression; ``dtype`` is always set.

    Python operators build nodes (their tables are ``_ARITHMETIC`` and ``_COMPARISONS``).
    """

    __slots__ = ("dtype",)
    _fields: tuple[str, ...] = ()
    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError("a symbolic expression has no truth value; use te.if_then_else / te.all")

    def astype(self, dtype: str) -> "PrimExpr":
        return cast(self, dtype)

    def __repr__(self):
        from .ir import expr_to_str
        return expr_to_str(self)


@node
class Var(PrimExpr):
    """A scalar variable (loop variable, symbolic shape, scalar parameter)."""

    _fields = ("name", "dtype")

    def __init__(self, name: str, dtype: str = "int32"):
        parse_dtype(dtype)
        self.name = name
        self.dtype = dtype


@node
class IntImm(PrimExpr):
    _fields = ("value", "dtype")

    def __init__(self, value: int, dtype: str = "int32"):
        self.value = wrap_int(int(value), dtype)
        self.dtype = dtype


@node
class FloatImm(PrimExpr):
    _fields = ("value", "dtype")

    def __init__(self, value: float, dtype: str = "float32"):
        self.value = float(value)
        self.dtype = dtype


@node
class BinaryOp(PrimExpr):
    _fields = ("a", "b")
    symbol = "?"

    def __init__(self, a: PrimExpr, b: PrimExpr):
        self.a = a
        self.b = b
        self.dtype = self._result_dtype(a, b)

    @staticmethod
    def _result_dtype(a, b):
        return a.dtype


class Add(BinaryOp):
    symbol = "+"


class Sub(BinaryOp):
    symbol = "-"


class Mul(BinaryOp):
    symbol = "*"


class Div(BinaryOp):
    """True division for floats, truncating division for integers."""
    symbol = "/"


class Mod(BinaryOp):
    """Truncating modulo (sign of the dividend)."""
    symbol = "%"


class FloorDiv(BinaryOp):
    symbol = "floordiv"


class FloorMod(BinaryOp):
    symbol = "floormod"


class Min(BinaryOp):
    symbol = "min"


class Max(BinaryOp):
    symbol = "max"


class CmpOp(BinaryOp):
    @staticmethod
    def _result_dtype(a, b):
        return with_lanes("bool", dtype_lanes(a.dtype))

    def __bool__(self):
        # lets `x in list_of_exprs` and `a == a` work on identity, as in TVM
        if isinstance(self, EQ):
            return self.a is self.b
        if isinstance(self, NE):
            return self.a is not self.b
        return PrimExpr.__bool__(self)


class EQ(CmpOp):
    symbol = "=="


class NE(CmpOp):
    symbol = "!="


class LT(CmpOp):
    symbol = "<"


class LE(CmpOp):
    symbol = "<="


class GT(CmpOp):
    symbol = ">"


class GE(CmpOp):
    symbol = ">="


class And(BinaryOp):
    symbol = "&&"


class Or(BinaryOp):
    symbol = "||"


@node
class Not(PrimExpr):
    _fields = ("a",)
    _dtype_of = "a"


@node
class Select(PrimExpr):
    """``condition ? true_value : false_value`` (TVM's if_then_else).

    Memory is read only where a branch is selected, so a branch may index out of bounds
    where the condition rules it out (padding, tails).
    """

    _fields = ("condition", "true_value", "false_value")
    _dtype_of = "true_value"


@node
class Cast(PrimExpr):
    _fields = ("dtype", "value")

    def __init__(self, dtype: str, value: PrimExpr):
        parse_dtype(dtype)
        self.dtype = dtype
        self.value = value


@node
class Call(PrimExpr):
    """A pure math intrinsic by name (see ``MATH_INTRINSICS``), elementwise on vectors."""

    _fields = ("dtype", "op", "args")
    _tuples = ("args",)


@node
class Let(PrimExpr):
    _fields = ("var", "value", "body")
    _dtype_of = "body"


#: Python operator -> the node it builds; the reflected form (``__radd__``) swaps the operands.
_ARITHMETIC = {"add": Add, "sub": Sub, "mul": Mul, "truediv": Div, "floordiv": FloorDiv,
               "mod": FloorMod}
_COMPARISONS = {"lt": LT, "le": LE, "gt": GT, "ge": GE, "eq": EQ, "ne": NE}


def _install_operators():
    for name, cls in _ARITHMETIC.items():
        setattr(PrimExpr, f"__{name}__", lambda self, o, cls=cls: _binary(cls, self, o))
        setattr(PrimExpr, f"__r{name}__", lambda self, o, cls=cls: _binary(cls, o, self))
    for name, cls in _COMPARISONS.items():
        setattr(PrimExpr, f"__{name}__", lambda self, o, cls=cls: _binary(cls, self, o))
    PrimExpr.__neg__ = lambda self: _binary(Sub, const(0, self.dtype), self)
    PrimExpr.__and__ = lambda self, o: logical_and(self, o)
    PrimExpr.__or__ = lambda self, o: logical_or(self, o)
    PrimExpr.__invert__ = lambda self: logical_not(self)


_install_operators()


#: name -> number of arguments; float -> float elementwise unless listed below.
MATH_INTRINSICS = {
    "exp": 1, "exp2": 1, "exp10": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1, "sqrt": 1,
    "tanh": 1, "sinh": 1, "cosh": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1,
    "atan": 1, "erf": 1, "fabs": 1, "floor": 1, "ceil": 1, "round": 1, "nearbyint": 1,
    "trunc": 1, "pow": 2, "atan2": 2, "hypot": 2, "copysign": 2, "fmod": 2, "fma": 3,
    "ldexp": 2, "nextafter": 2, "isnan": 1, "isinf": 1, "isfinite": 1, "clz": 1, "popcount": 1,
}
#: float -> bool (the lanes of the argument)
FLOAT_PREDICATES = ("isnan", "isinf", "isfinite")
#: int -> the same int type
INT_INTRINSICS = ("clz", "popcount")


# --------------------------------------------------------------------------- construction

def const(value, dtype: str | None = None) -> PrimExpr:
    """A constant; ``dtype`` defaults to int32 for ints/bools and float32 for floats."""
    if isinstance(value, PrimExpr):
        return value if dtype is None or value.dtype == dtype else cast(value, dtype)
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int32" if -2**31 <= value < 2**31 else "int64"
        elif isinstance(value, float):
            dtype = "float32"
        else:
            raise DTypeError(f"cannot make a constant from {type(value).__name__}")
    if is_float(dtype):
        return FloatImm(float(value), dtype)
    if not is_bool(dtype):
        lo, hi = int_range(dtype)
        if not lo <= int(value) <= hi:
            raise DTypeError(f"constant {value} does not fit {dtype} [{lo}, {hi}]")
    return IntImm(int(value), dtype)


def convert(value) -> PrimExpr:
    if isinstance(value, PrimExpr):
        return value
    if hasattr(value, "var") and isinstance(getattr(value, "var"), Var):  # IterVar
        return value.var
    if isinstance(value, (bool, int, float)):
        return const(value)
    raise DTypeError(f"cannot use {type(value).__name__} as an expression")


def _promote(a, b) -> tuple[PrimExpr, PrimExpr]:
    """Match operand dtypes: Python numbers take the other side's dtype."""
    a_py = not isinstance(a, PrimExpr) and not hasattr(a, "var")
    b_py = not isinstance(b, PrimExpr) and not hasattr(b, "var")
    if a_py and not b_py:
        b = convert(b)
        a = _literal_like(a, b.dtype)
    elif b_py and not a_py:
        a = convert(a)
        b = _literal_like(b, a.dtype)
    else:
        a, b = convert(a), convert(b)
    if a.dtype == b.dtype:
        return a, b
    ea, eb = dtype_element(a.dtype), dtype_element(b.dtype)
    la, lb = dtype_lanes(a.dtype), dtype_lanes(b.dtype)
    if la != lb:
        if la == 1:
            a = _broadcast(a, lb)
        elif lb == 1:
            b = _broadcast(b, la)
        else:
            raise DTypeError(f"lane mismatch: {a.dtype} vs {b.dtype}")
    if ea != eb:
        target = _wider(ea, eb)
        if ea != target:
            a = cast(a, with_lanes(target, dtype_lanes(a.dtype)))
        if eb != target:
            b = cast(b, with_lanes(target, dtype_lanes(b.dtype)))
    return a, b


def _broadcast(x, lanes):
    from .ir import Broadcast
    return Broadcast(x, lanes)


def _wider(ea: str, eb: str) -> str:
    fa, fb = is_float(ea), is_float(eb)
    if fa != fb:
        return ea if fa else eb
    return ea if dtype_bits(ea) >= dtype_bits(eb) else eb


def _literal_like(value, dtype: str) -> PrimExpr:
    elem = dtype_element(dtype)
    if isinstance(value, float) and not is_float(elem):
        return const(value, "float32" if elem != "float64" else elem)
    if isinstance(value, bool) and is_bool(elem):
        return const(value, "bool")
    if is_bool(elem):
        return const(value)
    if isinstance(value, int) and is_int(elem):
        lo, hi = int_range(elem)
        if not lo <= value <= hi:
            # as TVM: a literal the other side's dtype cannot hold widens the operation
            wide = "int32" if dtype_bits(elem) < 32 and -2**31 <= value < 2**31 else "int64"
            if not -2**63 <= value < 2**63 or (elem == "uint64"):
                raise DTypeError(f"literal {value} does not fit {elem}")
            return const(value, wide)
    return const(value, elem)


def _binary(cls, a, b) -> PrimExpr:
    a, b = _promote(a, b)
    return cls(a, b)


def floordiv(a, b) -> PrimExpr:
    return _binary(FloorDiv, a, b)


def floormod(a, b) -> PrimExpr:
    return _binary(FloorMod, a, b)


def truncdiv(a, b) -> PrimExpr:
    return _binary(Div, a, b)


def truncmod(a, b) -> PrimExpr:
    return _binary(Mod, a, b)


indexdiv = floordiv
indexmod = floormod


def min_value(dtype: str) -> PrimExpr:
    if parse_dtype(dtype)[0] == "float":
        return const(-math.inf, dtype)
    return const(int_range(dtype)[0], dtype)


def max_value(dtype: str) -> PrimExpr:
    if parse_dtype(dtype)[0] == "float":
        return const(math.inf, dtype)
    return const(int_range(dtype)[1], dtype)


def minimum(a, b) -> PrimExpr:
    return _binary(Min, a, b)


def maximum(a, b) -> PrimExpr:
    return _binary(Max, a, b)


def _as_bool(x) -> PrimExpr:
    x = convert(x)
    if not is_bool(x.dtype):
        x = NE(x, const(0, x.dtype))
    return x


def logical_and(a, b) -> PrimExpr:
    return And(_as_bool(a), _as_bool(b))


def logical_or(a, b) -> PrimExpr:
    return Or(_as_bool(a), _as_bool(b))


def logical_not(a) -> PrimExpr:
    return Not(_as_bool(a))


def all_of(*conds) -> PrimExpr:
    out = None
    for c in conds:
        out = _as_bool(c) if out is None else logical_and(out, c)
    return const(True) if out is None else out


def any_of(*conds) -> PrimExpr:
    out = None
    for c in conds:
        out = _as_bool(c) if out is None else logical_or(out, c)
    return const(False) if out is None else out


def cast(value, dtype: str) -> PrimExpr:
    value = convert(value)
    lanes = dtype_lanes(value.dtype)
    if dtype_lanes(dtype) == 1 and lanes > 1:
        dtype = with_lanes(dtype, lanes)
    if value.dtype == dtype:
        return value
    return Cast(dtype, value)


def _broadcast_const(value: bool, lanes: int) -> PrimExpr:
    c = const(bool(value))
    return c if lanes == 1 else _broadcast(c, lanes)


def if_then_else(cond, t, f) -> PrimExpr:
    t, f = _promote(t, f)
    return Select(_as_bool(cond), t, f)


def reinterpret(dtype: str, value) -> PrimExpr:
    """TVM's ``tir.reinterpret``: the bits of ``value`` as ``dtype`` (of the same width: four
    uint8 lanes as one int32, sixteen int32 lanes as sixty-four int8)."""
    value = convert(value)
    if dtype_bits(dtype) * dtype_lanes(dtype) != dtype_bits(value.dtype) * dtype_lanes(value.dtype):
        raise DTypeError(f"reinterpret of {value.dtype} as {dtype}: the widths differ")
    return Call(dtype, "reinterpret", [value])


def call_llvm_pure_intrin(dtype: str, name: str, *args) -> PrimExpr:
    """TVM's ``tir.call_llvm_pure_intrin``: the LLVM intrinsic ``name`` (``llvm.x86...``), of
    the argument and result types the expressions have (its name fixes them: a loop holding
    one is written in the vector form, not vectorized over it); the caller makes sure the
    target has it (LLVM cannot select an intrinsic the target lacks)."""
    if not name.startswith("llvm.") or not all(c.isalnum() or c in "._" for c in name):
        raise DTypeError(f"{name!r} is not the name of an LLVM intrinsic")
    return Call(dtype, name, [convert(a) for a in args])


def call_math(op: str, *args) -> PrimExpr:
    nargs = MATH_INTRINSICS.get(op)
    if nargs is None or nargs != len(args):
        raise DTypeError(f"unknown intrinsic {op}/{len(args)}")
    conv = [convert(a) for a in args]
    if op in INT_INTRINSICS:
        if not is_int(conv[0].dtype):
            raise DTypeError(f"{op} needs an integer argument, got {conv[0].dtype}")
        return Call(conv[0].dtype, op, conv)
    if op in FLOAT_PREDICATES:
        x = conv[0]
        lanes = dtype_lanes(x.dtype)
        if not is_float(x.dtype):          # an integer is never NaN or infinite (as in TVM)
            return _broadcast_const(op == "isfinite", lanes)
        return Call(with_lanes("bool", lanes), op, conv)
    if op == "ldexp":
        x, e = conv
        if not is_float(x.dtype):
            x = cast(x, "float32")
        return Call(x.dtype, op, [x, cast(e, with_lanes("int32", dtype_lanes(x.dtype)))])
    dtype = next((a.dtype for a in conv if is_float(a.dtype)), "float32")
    conv = [a if a.dtype == dtype else cast(a, dtype) for a in conv]
    return Call(dtype, op, conv)
