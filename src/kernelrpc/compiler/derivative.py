"""Symbolic derivatives of scalar expressions, for :mod:`kernelrpc.compiler.gradient`.

``derive(expr, read, where)`` is d expr / d read, where ``read`` is one TensorLoad node in
``expr`` (every other node held constant), or None where it is 0; what cannot be
differentiated raises :class:`GradientError` naming the construct and ``where`` (the op).
"""
from __future__ import annotations

import math

from . import expr as E
from .expr import Var, const, if_then_else, is_float
from .tensor import TensorLoad


class GradientError(ValueError):
    """te.gradient met a construct it cannot differentiate; the message names it."""


def derive(node, target: TensorLoad, where: str):
    """d node / d target (the read ``target``, other reads held constant), or None for 0."""
    if node is target:
        return const(1.0, node.dtype)
    if isinstance(node, (TensorLoad, Var, E.IntImm, E.FloatImm, E.CmpOp, E.And, E.Or, E.Not)):
        return None
    rule = _RULES.get(type(node))
    if rule is None:
        raise GradientError(f"te.gradient: {where}: {type(node).__name__} ({node!r}) cannot be "
                            "differentiated")
    return rule(node, target, where)


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _mul(a, b):
    return None if a is None or b is None else a * b


def _neg(a):
    return None if a is None else -a


def _binary(node, target, where):
    da, db = derive(node.a, target, where), derive(node.b, target, where)
    if da is None and db is None:
        return None
    if not is_float(node.dtype):
        raise GradientError(f"te.gradient: {where}: {node!r} is integer arithmetic on a float "
                            "value; it cannot be differentiated")
    a, b = node.a, node.b
    kind = type(node)
    if kind is E.Add:
        return _add(da, db)
    if kind is E.Sub:
        return _add(da, _neg(db))
    if kind is E.Mul:
        return _add(_mul(da, b), _mul(a, db))
    if kind is E.Div:
        return _add(_mul(da, 1.0 / b) if da is not None else None,
                    _neg(_mul(db, a / (b * b))) if db is not None else None)
    if kind in (E.Min, E.Max):
        zero = const(0.0, node.dtype)
        first = (a <= b) if kind is E.Min else (a >= b)
        return if_then_else(first, zero if da is None else da, zero if db is None else db)
    raise GradientError(f"te.gradient: {where}: {kind.__name__} ({node!r}) cannot be differentiated")


def _select(node, target, where):
    dt, df = derive(node.true_value, target, where), derive(node.false_value, target, where)
    if dt is None and df is None:
        return None
    zero = const(0.0, node.dtype)
    return if_then_else(node.condition, zero if dt is None else dt, zero if df is None else df)


def _cast(node, target, where):
    d = derive(node.value, target, where)
    if d is None:
        return None
    if not (is_float(node.dtype) and is_float(node.value.dtype)):
        raise GradientError(f"te.gradient: {where}: the cast {node!r} leaves the floats; it "
                            "cannot be differentiated")
    return d.astype(node.dtype)


def _m(name, *args):
    return E.call_math(name, *args)


_LN2, _LN10 = math.log(2.0), math.log(10.0)
#: math function -> d f(x) / dx, as an expression of x and f(x)
_UNARY = {
    "exp": lambda x, f: f,
    "exp2": lambda x, f: f * _LN2,
    "exp10": lambda x, f: f * _LN10,
    "log": lambda x, f: 1.0 / x,
    "log2": lambda x, f: 1.0 / (x * _LN2),
    "log10": lambda x, f: 1.0 / (x * _LN10),
    "log1p": lambda x, f: 1.0 / (x + 1.0),
    "sqrt": lambda x, f: 0.5 / f,
    "tanh": lambda x, f: 1.0 - f * f,
    "sinh": lambda x, f: _m("cosh", x),
    "cosh": lambda x, f: _m("sinh", x),
    "sin": lambda x, f: _m("cos", x),
    "cos": lambda x, f: -_m("sin", x),
    "tan": lambda x, f: 1.0 + f * f,
    "asin": lambda x, f: 1.0 / _m("sqrt", 1.0 - x * x),
    "acos": lambda x, f: -1.0 / _m("sqrt", 1.0 - x * x),
    "atan": lambda x, f: 1.0 / (1.0 + x * x),
    "erf": lambda x, f: (2.0 / math.sqrt(math.pi)) * _m("exp", -(x * x)),
    "fabs": lambda x, f: if_then_else(x >= 0.0, const(1.0, x.dtype), const(-1.0, x.dtype)),
}
_STEPS = ("floor", "ceil", "round", "nearbyint", "trunc")   # flat almost everywhere: 0


def _call(node, target, where):
    op, args = node.op, node.args
    ds = [derive(a, target, where) for a in args]
    if all(d is None for d in ds):
        return None
    if op in _STEPS:
        return None
    if op in _UNARY:
        return _mul(ds[0], _UNARY[op](args[0], node))
    if op == "pow":
        a, b = args
        return _add(_mul(ds[0], b * _m("pow", a, b - 1.0)), _mul(ds[1], node * _m("log", a)))
    if op == "atan2":
        y, x = args
        r2 = x * x + y * y
        return _add(_mul(ds[0], x / r2), _neg(_mul(ds[1], y / r2)))
    if op == "hypot":
        a, b = args
        return _add(_mul(ds[0], a / node), _mul(ds[1], b / node))
    if op == "fma":
        a, b, _c = args
        return _add(_add(_mul(ds[0], b), _mul(a, ds[1])), ds[2])
    raise GradientError(f"te.gradient: {where}: {op}() cannot be differentiated")


_RULES = {E.Add: _binary, E.Sub: _binary, E.Mul: _binary, E.Div: _binary, E.Min: _binary,
          E.Max: _binary, E.Select: _select, E.Cast: _cast, E.Call: _call}
