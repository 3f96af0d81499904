"""ONNX converters of the elementwise operators: arithmetic with broadcasting, activations,
Clip, Cast."""
from __future__ import annotations

from functools import partial

import numpy as np

from .. import ir
from ..errors import ModelError
from . import onnx_model
from .onnx_common import converter

_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
           "Pow": "power"}
_VARIADIC = {"Sum": "add", "Max": "maximum", "Min": "minimum"}
_COMPARE = {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
            "GreaterOrEqual": "greater_equal"}
_LOGIC = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}


def _binary(ctx, args, attrs, op):
    a, b = args
    return [ctx.make(op, [a, b])]


def _fold_inputs(ctx, args, op):
    if not args or any(a is None for a in args):
        raise ModelError(f"{ctx.op_type} needs at least one input")
    out = args[0]
    for other in args[1:]:
        out = ctx.make(op, [out, other])
    return out


def _variadic(ctx, args, attrs, op):
    return [_fold_inputs(ctx, args, op)]


@converter("Mean")
def _mean(ctx, args, attrs):
    out = _fold_inputs(ctx, args, "add")
    if len(args) > 1:
        out = ctx.make("multiply", [out, ir.const(np.asarray(1 / len(args), out.dtype))])
    return [out]


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
          "Sqrt": "sqrt", "Neg": "negative", "Abs": "abs", "Floor": "floor", "Ceil": "ceil",
          "Reciprocal": "reciprocal", "HardSwish": "hard_swish", "Not": "logical_not",
          "IsNaN": "isnan"}


def _unary(ctx, args, attrs, op):
    return [ctx.make(op, [args[0]])]


for _table, _convert in ((_BINARY, _binary), (_COMPARE, _binary), (_LOGIC, _binary),
                         (_VARIADIC, _variadic), (_UNARY, _unary)):
    for _onnx_op, _op in _table.items():
        converter(_onnx_op)(partial(_convert, op=_op))
# versions after opset 18 that only widened the types (string, bfloat16, float8)
converter("Equal", since=19)(partial(_binary, op="equal"))
converter("IsNaN", since=20)(partial(_unary, op="isnan"))


@converter("IsInf")
@converter("IsInf", since=20)
def _isinf(ctx, args, attrs):
    return [ctx.make("isinf", [args[0]], negative=bool(attrs.get("detect_negative", 1)),
                     positive=bool(attrs.get("detect_positive", 1)))]


@converter("Where")
def _where(ctx, args, attrs):
    return [ctx.make("where", args)]


@converter("LeakyRelu")
def _leaky(ctx, args, attrs):
    return [ctx.make("leaky_relu", [args[0]], alpha=float(attrs.get("alpha", 0.01)))]


@converter("HardSigmoid")
def _hard_sigmoid(ctx, args, attrs):
    return [ctx.make("hard_sigmoid", [args[0]], alpha=float(attrs.get("alpha", 0.2)),
                     beta=float(attrs.get("beta", 0.5)))]


@converter("PRelu")
def _prelu(ctx, args, attrs):
    x, slope = args
    neg = ctx.make("minimum", [x, ir.const(np.zeros((), x.dtype))])
    return [ctx.make("add", [ctx.make("relu", [x]), ctx.make("multiply", [neg, slope])])]


def _clip(ctx, x, lo, hi):
    return [ctx.make("clip", [x], min=None if lo is None else float(lo),
                     max=None if hi is None else float(hi))]


@converter("Clip")
def _clip_6(ctx, args, attrs):
    return _clip(ctx, args[0], attrs.get("min", None), attrs.get("max", None))


@converter("Clip", since=11)
def _clip_11(ctx, args, attrs):
    """Bounds given as tensors computed at run time clip through maximum and minimum."""
    x, bounds = args[0], list(args[1:3]) + [None] * (3 - len(args))
    if all(b is None or b.is_const for b in bounds):
        return _clip(ctx, x, ctx.optional_float(args, 1, "Clip's min", None),
                     ctx.optional_float(args, 2, "Clip's max", None))
    for op, bound in zip(("maximum", "minimum"), bounds):
        if bound is not None:
            x = ctx.make(op, [x, bound])
    return [x]


def _cast(ctx, x, dtype):
    return [x] if x.dtype == dtype else [ctx.make("cast", [x], dtype=dtype)]


@converter("Cast")
@converter("Cast", since=19)       # saturate: float8 only, which kernelrpc does not take
@converter("Cast", since=24)       # round_mode: float8e8m0 only, refused when set
def _cast_to(ctx, args, attrs):
    attrs.ignore("saturate")
    return _cast(ctx, args[0], onnx_model.elem_dtype(int(attrs.get("to")), "Cast's to"))


@converter("CastLike", since=15)
@converter("CastLike", since=19)
def _cast_like(ctx, args, attrs):
    attrs.ignore("saturate")
    return _cast(ctx, args[0], args[1].dtype)


