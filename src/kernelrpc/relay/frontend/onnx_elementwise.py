"""ONNX converters of the elementwise operators: arithmetic with broadcasting, activations,
Clip, Cast."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from . import onnx_model
from .onnx_common import converter

_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
           "Pow": "power"}


@converter(*_BINARY)
def _binary(ctx, args, attrs):
    a, b = args
    return [ctx.make(_BINARY[ctx.op_type], [a, b])]


@converter("Sum", "Max", "Min", "Mean")
def _variadic(ctx, args, attrs):
    op = {"Sum": "add", "Mean": "add", "Max": "maximum", "Min": "minimum"}[ctx.op_type]
    if not args or any(a is None for a in args):
        raise ModelError(f"{ctx.op_type} needs at least one input")
    out = args[0]
    for other in args[1:]:
        out = ctx.make(op, [out, other])
    if ctx.op_type == "Mean" and len(args) > 1:
        out = ctx.make("multiply", [out, ir.const(np.asarray(1 / len(args), out.dtype))])
    return [out]


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
          "Sqrt": "sqrt", "Neg": "negative", "Abs": "abs", "Floor": "floor", "Ceil": "ceil",
          "Reciprocal": "reciprocal", "HardSwish": "hard_swish"}


@converter(*_UNARY)
def _unary(ctx, args, attrs):
    return [ctx.make(_UNARY[ctx.op_type], [args[0]])]


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


@converter("Clip")
def _clip(ctx, args, attrs):
    if ctx.opset < 11:
        lo, hi = attrs.get("min", None), attrs.get("max", None)
    else:
        lo = float(ctx.constant(args[1], "Clip's min").reshape(())) if len(args) > 1 and \
            args[1] is not None else None
        hi = float(ctx.constant(args[2], "Clip's max").reshape(())) if len(args) > 2 and \
            args[2] is not None else None
    return [ctx.make("clip", [args[0]], min=None if lo is None else float(lo),
                     max=None if hi is None else float(hi))]




@converter("Cast")
def _cast(ctx, args, attrs):
    dtype = onnx_model.elem_dtype(int(attrs.get("to")), "Cast's to")
    attrs.get("saturate")
    x = args[0]
    if x.dtype == dtype:
        return [x]
    return [ctx.make("cast", [x], dtype=dtype)]


