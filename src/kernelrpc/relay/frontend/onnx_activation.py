"""ONNX converters of the activations and elementwise math beyond the basic ones: Erf, Gelu,
Softplus, Softsign, Mish, Elu, Selu, Celu, ThresholdedRelu, Sign, Round, Sin, Cos, Mod and
Hardmax. The floating-point ones compute float32 only; another dtype is refused by name."""
from __future__ import annotations

import math

import numpy as np

from .. import ir
from ..op.activation import FLOAT_ONLY
from .onnx_common import Unsupported, converter, normalize_axis, reshape

_SIGNED = ("float32", "int8", "int16", "int32", "int64")
_MOD_DTYPES = _SIGNED + ("uint8", "uint16", "uint32", "uint64")

_UNARY = {"Erf": "erf", "Softplus": "softplus", "Softsign": "softsign", "Mish": "mish",
          "Sign": "sign", "Round": "round", "Sin": "sin", "Cos": "cos"}


def check_dtype(ctx, x, allowed=("float32",)) -> None:
    if x.dtype not in allowed:
        raise Unsupported(f"{ctx.op_type} of {x.dtype} is not implemented (only "
                          f"{', '.join(allowed)})")


def _float_unary(ctx, x, op, **attrs):
    check_dtype(ctx, x, ("float32",) if op in FLOAT_ONLY else _SIGNED)
    return [ctx.make(op, [x], **attrs)]


@converter(*_UNARY)
def _unary(ctx, args, attrs):
    return _float_unary(ctx, args[0], _UNARY[ctx.op_type])


@converter("Gelu")
def _gelu(ctx, args, attrs):
    approximate = attrs.get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"approximate={approximate!r} (only 'none' and 'tanh')")
    return _float_unary(ctx, args[0], "gelu", approximate=approximate)


@converter("Elu", "ThresholdedRelu")
def _alpha_unary(ctx, args, attrs):
    op = {"Elu": "elu", "ThresholdedRelu": "thresholded_relu"}[ctx.op_type]
    return _float_unary(ctx, args[0], op, alpha=float(attrs.get("alpha", 1.0)))


@converter("Selu")
def _selu(ctx, args, attrs):
    return _float_unary(ctx, args[0], "selu",
                        alpha=float(attrs.get("alpha", 1.67326319217681884765625)),
                        gamma=float(attrs.get("gamma", 1.05070102214813232421875)))


@converter("Celu")
def _celu(ctx, args, attrs):
    alpha = float(attrs.get("alpha", 1.0))
    if alpha == 0:
        raise Unsupported("Celu with alpha=0 (it divides by alpha)")
    return _float_unary(ctx, args[0], "celu", alpha=alpha)


@converter("Mod")
@converter("Mod", since=28)
def _mod(ctx, args, attrs):
    """Opset 28 defines ``fmod=0`` of floats too: the floored remainder, from the truncated one
    moved by ``b`` where the two differ in sign, a zero taking ``b``'s sign."""
    a, b = args
    fmod = int(attrs.get("fmod", 0))
    check_dtype(ctx, a, _MOD_DTYPES)
    if a.dtype == "float32" and not fmod:
        if ctx.opset < 28:
            raise Unsupported("Mod of floats needs fmod=1 before opset 28 (which defines fmod=0 "
                              "for floats)")
        return [_floored_mod(ctx, a, b)]
    return [ctx.make("mod", [a, b], fmod=bool(fmod))]


def _floored_mod(ctx, a, b):
    """``a - floor(a / b) * b`` with Mod-28's rules: NaN for an infinite ``a`` or a zero ``b``
    (the truncated remainder's), ``a`` or ``b`` for an infinite ``b``, a zero of ``b``'s sign."""
    def const(value):
        return ir.const(np.asarray(value, np.float32))
    r = ctx.make("mod", [a, b], fmod=True)
    r_neg, r_pos = ctx.make("less", [r, const(0)]), ctx.make("greater", [r, const(0)])
    b_neg, b_pos = ctx.make("less", [b, const(0)]), ctx.make("greater", [b, const(0)])
    differ = ctx.make("logical_or", [ctx.make("logical_and", [r_neg, b_pos]),
                                     ctx.make("logical_and", [r_pos, b_neg])])
    moved = ctx.make("where", [differ, ctx.make("add", [r, b]), r])
    signed_zero = ctx.make("where", [b_neg, const(-0.0), const(0.0)])
    return ctx.make("where", [ctx.make("equal", [r, const(0)]), signed_zero, moved])


@converter("Hardmax")
def _hardmax(ctx, args, attrs):
    """From opset 13 along one axis; before, over the input flattened to 2-D at ``axis``."""
    x = args[0]
    check_dtype(ctx, x)
    ndim = len(x.shape)
    axis = normalize_axis(int(attrs.get("axis", -1 if ctx.opset >= 13 else 1)), ndim)
    if ctx.opset >= 13 or axis == ndim - 1:
        return [ctx.make("hardmax", [x], axis=axis)]
    flat = reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return [reshape(ctx, ctx.make("hardmax", [flat], axis=1), x.shape)]
