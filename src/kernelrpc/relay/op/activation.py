"""Elementwise math past the basic activations: erf and GELU, the ELU family, softplus,
softsign, mish, thresholded ReLU, sign, round-half-to-even, sine, cosine and the modulus.

Each has its tensor expression and its numpy form (constant folding) side by side.
"""
from __future__ import annotations

import math

import numpy as np

from ... import te
from ...compiler import expr as E
from .elemwise import _binary_infer as binary_infer
from .elemwise import _unary as register_unary
from .elemwise import broadcast_index
from .registry import register


def _c(value, dtype):
    return te.const(value, dtype)


def _softplus(v, dt):
    """log(1 + e^v) without overflow: max(v, 0) + log1p(e^-|v|)."""
    return E.maximum(v, _c(0, dt)) + te.log1p(te.exp(-te.abs(v)))


def _np_softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


_np_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _gelu(v, a, dt):
    if a["approximate"] == "tanh":
        inner = _c(_SQRT_2_OVER_PI, dt) * (v + _c(0.044715, dt) * v * v * v)
        return _c(0.5, dt) * v * (_c(1, dt) + te.tanh(inner))
    return _c(0.5, dt) * v * (_c(1, dt) + te.erf(v * _c(1 / math.sqrt(2), dt)))


def _np_gelu(x, a):
    if a["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _np_erf(x / math.sqrt(2)))


def _elu(v, a, dt):
    return E.if_then_else(v < _c(0, dt), _c(a["alpha"], dt) * (te.exp(v) - _c(1, dt)), v)


def _selu(v, a, dt):
    negative = _c(a["alpha"], dt) * te.exp(v) - _c(a["alpha"], dt)
    return _c(a["gamma"], dt) * E.if_then_else(v > _c(0, dt), v, negative)


def _celu(v, a, dt):
    alpha = _c(a["alpha"], dt)
    negative = alpha * (te.exp(v / alpha) - _c(1, dt))
    return E.maximum(v, _c(0, dt)) + E.minimum(_c(0, dt), negative)


def _sign(v, a, dt):
    """+1, -1, or the value itself (0, or NaN)."""
    return E.if_then_else(v > _c(0, dt), _c(1, dt), E.if_then_else(v < _c(0, dt), _c(-1, dt), v))


#: name -> (tensor expression of one element, numpy form, float only)
_UNARY = {
    "erf": (lambda v, a, dt: te.erf(v), lambda x, a: _np_erf(x), True),
    "gelu": (_gelu, _np_gelu, True),
    "softplus": (lambda v, a, dt: _softplus(v, dt), lambda x, a: _np_softplus(x), True),
    "softsign": (lambda v, a, dt: v / (_c(1, dt) + te.abs(v)),
                 lambda x, a: x / (1 + np.abs(x)), True),
    "mish": (lambda v, a, dt: v * te.tanh(_softplus(v, dt)),
             lambda x, a: x * np.tanh(_np_softplus(x)), True),
    "elu": (_elu, lambda x, a: np.where(x < 0, a["alpha"] * (np.exp(x) - 1), x), True),
    "selu": (_selu, lambda x, a: a["gamma"] * np.where(
        x > 0, x, a["alpha"] * np.exp(x) - a["alpha"]), True),
    "celu": (_celu, lambda x, a: np.maximum(x, 0) + np.minimum(
        0, a["alpha"] * (np.exp(x / a["alpha"]) - 1)), True),
    "thresholded_relu": (lambda v, a, dt: E.if_then_else(v > _c(a["alpha"], dt), v, _c(0, dt)),
                         lambda x, a: np.where(x > a["alpha"], x, 0), True),
    "sign": (_sign, lambda x, a: np.sign(x), False),
    "round": (lambda v, a, dt: te.nearbyint(v), lambda x, a: np.round(x), True),
    "sin": (lambda v, a, dt: te.sin(v), lambda x, a: np.sin(x), True),
    "cos": (lambda v, a, dt: te.cos(v), lambda x, a: np.cos(x), True),
}
FLOAT_ONLY = frozenset(name for name, (_, _, only) in _UNARY.items() if only)


for _name, (_body, _fold, _) in _UNARY.items():
    register_unary(_name, _body, lambda xs, a, fold=_fold: np.asarray(fold(xs[0], a))
                   .astype(xs[0].dtype))


# ------------------------------------------------------------------ modulus


def _mod(x, y, fmod):
    """``fmod``: C's (the dividend's sign), else Python's (the divisor's). An integer divisor of
    0 gives 0, as numpy (the processor would trap)."""
    if E.is_float(x.dtype):
        return te.fmod(x, y)
    zero = y == _c(0, y.dtype)
    safe = E.if_then_else(zero, _c(1, y.dtype), y)
    out = E.truncmod(x, safe) if fmod else E.floormod(x, safe)
    return E.if_then_else(zero, _c(0, x.dtype), out)


def _mod_fold(xs, attrs):
    a, b = xs
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(a, b) if attrs["fmod"] else np.mod(a, b)
    if a.dtype.kind in "iu":
        out = np.where(b == 0, 0, out)
    return out.astype(a.dtype)


register("mod", "broadcast", binary_infer,
         lambda ts, attrs, node: te.compute(node.shape, lambda *i: _mod(
             broadcast_index(ts[0], i), broadcast_index(ts[1], i), attrs["fmod"]), name="mod"),
         _mod_fold)
