"""ONNX converters of the network layers: Conv, ConvTranspose, Gemm, MatMul, Softmax,
BatchNormalization, pooling, LRN."""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from .. import ir
from ..errors import ModelError
from .onnx_common import Unsupported, converter, normalize_axis, reshape


def _spatial_pads(attrs, in_shape, kernel, strides, dilations, what):
    auto = attrs.get("auto_pad", "NOTSET")
    nsp = len(kernel)
    pads = attrs.ints("pads", [0] * (2 * nsp))
    if len(pads) != 2 * nsp or any(p < 0 for p in pads):
        raise ModelError(f"{what}: pads {pads} must be {2 * nsp} non-negative integers")
    if auto in ("NOTSET", ""):
        return pads
    if auto == "VALID":
        return [0] * (2 * nsp)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else large)
        end.append(large if auto == "SAME_UPPER" else small)
    return begin + end


def _pair(attrs, name, default, lo=1):
    """A 2-D attribute (strides, dilations, kernel_shape...): two integers of at least ``lo``."""
    values = attrs.ints(name, default)
    if values is None or len(values) != 2 or any(v < lo for v in values):
        raise ModelError(f"{name} {values} must be two integers of at least {lo}")
    return values


@converter("Conv")
def _conv(ctx, args, attrs):
    x, w = args[0], args[1]
    if len(x.shape) != 4:
        raise Unsupported(f"only 2-D convolution (4-D input) is implemented, input is "
                          f"{list(x.shape)}")
    if len(w.shape) != 4:
        raise ModelError(f"the weight of a 2-D convolution must be 4-D, got {list(w.shape)}")
    kernel = _pair(attrs, "kernel_shape", list(w.shape[2:]))
    if list(kernel) != list(w.shape[2:]):
        raise ModelError(f"kernel_shape {kernel} does not match the weight {list(w.shape)}")
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    groups = int(attrs.get("group", 1))
    if groups <= 0:
        raise ModelError(f"group {groups} must be positive")
    pads = _spatial_pads(attrs, x.shape[2:], kernel, strides, dilations, "Conv")
    out = ctx.make("nn.conv2d", [x, w], strides=tuple(strides), dilation=tuple(dilations),
                   padding=(pads[0], pads[1], pads[2], pads[3]), groups=groups)
    if len(args) > 2 and args[2] is not None:
        out = ctx.make("add", [out, reshape(ctx, args[2], (1, args[2].size, 1, 1))])
    return [out]


@converter("ConvTranspose")
def _conv_transpose(ctx, args, attrs):
    x, w = args[0], args[1]
    if len(x.shape) != 4:
        raise Unsupported("only 2-D transposed convolution (4-D input) is implemented")
    weight = ctx.constant(w, "the weight of ConvTranspose")
    groups = int(attrs.get("group", 1))
    c, ocg, kh, kw = weight.shape
    if groups <= 0 or c % groups or c != x.shape[1]:
        raise ModelError(f"weight {list(weight.shape)}, {x.shape[1]} input channels and "
                         f"group={groups} do not agree")
    kernel = _pair(attrs, "kernel_shape", [kh, kw])
    if list(kernel) != [kh, kw]:
        raise ModelError(f"kernel_shape {kernel} does not match the weight")
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    out_pad = _pair(attrs, "output_padding", [0, 0], lo=0)
    out_shape = attrs.ints("output_shape", None)
    if out_shape is not None and (len(out_shape) not in (2, 4) or min(out_shape) <= 0):
        raise ModelError(f"output_shape {out_shape} must be 2 (or 4) positive integers")
    auto = attrs.get("auto_pad", "NOTSET")
    pads = attrs.ints("pads", [0, 0, 0, 0])
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    span = [(k - 1) * d + 1 for k, d in zip((kh, kw), dilations)]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = out_shape[-2:] if out_shape is not None else [
            size * s for size, s in zip(x.shape[2:], strides)]
        begin, end = [], []
        for size, s, sp, op, t in zip(x.shape[2:], strides, span, out_pad, target):
            total = s * (size - 1) + op + sp - t
            if total < 0:                             # more output than the kernel covers:
                begin.append(0)                       # the rest is added at the end
                end.append(total)
                continue
            upper = auto == "SAME_UPPER"
            begin.append(total // 2 if upper else total - total // 2)
            end.append(total - total // 2 if upper else total // 2)
        pads = begin + end
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    # a transposed convolution is a convolution over the input upsampled by the stride (zeros
    # between elements), padded by the kernel's span less the pads, with the flipped kernel
    flipped = weight.reshape(groups, c // groups, ocg, kh, kw).transpose(0, 2, 1, 3, 4)
    flipped = np.ascontiguousarray(flipped.reshape(groups * ocg, c // groups, kh, kw)[:, :, ::-1, ::-1])
    padding = (span[0] - 1 - pads[0], span[1] - 1 - pads[1],
               span[0] - 1 - pads[2] + out_pad[0], span[1] - 1 - pads[3] + out_pad[1])
    out = ctx.make("nn.conv2d", [x, ir.const(flipped, w.name)], strides=(1, 1),
                   dilation=tuple(dilations), padding=padding, groups=groups,
                   upsample=tuple(strides))
    if len(args) > 2 and args[2] is not None:
        out = ctx.make("add", [out, reshape(ctx, args[2], (1, args[2].size, 1, 1))])
    return [out]


def _dense(ctx, a, b_value, name):
    """``a @ b`` for a 2-D constant ``b``; ``a`` of any rank >= 2 (leading dimensions folded)."""
    lead = a.shape[:-1]
    flat = reshape(ctx, a, (math.prod(lead), a.shape[-1])) if len(a.shape) != 2 else a
    out = ctx.make("nn.dense", [flat, ir.const(np.ascontiguousarray(b_value), name)])
    return reshape(ctx, out, (*lead, b_value.shape[1])) if len(a.shape) != 2 else out


@converter("Gemm")
def _gemm(ctx, args, attrs):
    a, b = args[0], args[1]
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ModelError(f"Gemm needs 2-D operands, got {list(a.shape)} and {list(b.shape)}")
    if trans_a:
        a = ctx.make("transpose", [a], axes=(1, 0))
    if b.is_const:
        value = b.value.T if trans_b else b.value
        out = _dense(ctx, a, value * np.asarray(alpha, value.dtype) if alpha != 1 else value,
                     b.name)
    else:
        if trans_b:
            b = ctx.make("transpose", [b], axes=(1, 0))
        out = ctx.make("nn.batch_matmul", [a, b])
        if alpha != 1:
            out = ctx.make("multiply", [out, ir.const(np.asarray(alpha, out.dtype))])
    if len(args) > 2 and args[2] is not None and beta != 0:
        c = args[2]
        if beta != 1:
            c = ctx.make("multiply", [c, ir.const(np.asarray(beta, c.dtype))])
        out = ctx.make("add", [out, c])
    return [out]


@converter("MatMul")
def _matmul(ctx, args, attrs):
    a, b = args
    if len(a.shape) == 1 or len(b.shape) == 1:
        a2 = reshape(ctx, a, (1, a.shape[0])) if len(a.shape) == 1 else a
        b2 = reshape(ctx, b, (b.shape[0], 1)) if len(b.shape) == 1 else b
        out = _matmul(ctx, [a2, b2], attrs)[0]
        shape = list(out.shape)
        if len(a.shape) == 1:
            shape.pop(-2)
        if len(b.shape) == 1:
            shape.pop(-1)
        return [reshape(ctx, out, shape)]
    if b.is_const and len(b.shape) == 2:
        if a.shape[-1] != b.shape[0]:
            raise ModelError(f"MatMul of {list(a.shape)} and {list(b.shape)}")
        return [_dense(ctx, a, b.value, b.name)]
    return [ctx.make("nn.batch_matmul", [a, b])]




def _softmax_1(ctx, args, attrs, log):
    """Before opset 13 the input is taken as 2-D, flattened at ``axis``."""
    x = args[0]
    ndim = len(x.shape)
    axis = normalize_axis(int(attrs.get("axis", 1)), ndim)
    if axis == ndim - 1:
        return [ctx.make("nn.softmax", [x], axis=axis, log=log)]
    flat = reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    out = ctx.make("nn.softmax", [flat], axis=1, log=log)
    return [reshape(ctx, out, x.shape)]


def _softmax_13(ctx, args, attrs, log):
    axis = normalize_axis(int(attrs.get("axis", -1)), len(args[0].shape))
    return [ctx.make("nn.softmax", [args[0]], axis=axis, log=log)]


for _op, _log in (("Softmax", False), ("LogSoftmax", True)):
    converter(_op)(partial(_softmax_1, log=_log))
    converter(_op, since=13)(partial(_softmax_13, log=_log))


@converter("BatchNormalization")
def _batch_norm(ctx, args, attrs):
    x = args[0]
    eps = float(attrs.get("epsilon", 1e-5))
    attrs.ignore("momentum")
    if int(attrs.get("training_mode", 0)):
        raise Unsupported("training_mode=1 (batch statistics) is not implemented")
    scale, bias, mean, var = (ctx.constant(a, f"BatchNormalization's {n}") for a, n in
                              zip(args[1:5], ("scale", "B", "mean", "var")))
    if len(x.shape) < 2 or any(v.shape != (x.shape[1],) for v in (scale, bias, mean, var)):
        raise ModelError(f"BatchNormalization of {list(x.shape)}: the statistics must have "
                         f"{x.shape[1] if len(x.shape) > 1 else '?'} entries")
    spread = var.astype(np.float64) + eps
    if not np.all(spread > 0):
        raise ModelError(f"BatchNormalization: var + epsilon must be positive, got "
                         f"{float(spread.min())} (the statistics are not a variance)")
    a = (scale / np.sqrt(spread)).astype(x.dtype)
    b = (bias - mean * a).astype(x.dtype)
    shape = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
    out = ctx.make("multiply", [x, ir.const(a.reshape(shape))])
    out = ctx.make("add", [out, ir.const(b.reshape(shape))])
    out.origin = ("BatchNormalization",)
    return [out]


def _pool(ctx, args, attrs, kind):
    x = args[0]
    if len(x.shape) != 4:
        raise Unsupported(f"only 2-D pooling (4-D input) is implemented, input is {list(x.shape)}")
    kernel = _pair(attrs, "kernel_shape", None)
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    pads = _spatial_pads(attrs, x.shape[2:], kernel, strides, dilations, ctx.op_type)
    ceil = int(attrs.get("ceil_mode", 0))
    include = int(attrs.get("count_include_pad", 0)) if kind == "avg" else 0
    if kind == "max" and int(attrs.get("storage_order", 0)):
        raise Unsupported("storage_order=1 is not implemented")
    if kind == "avg" and dilations != [1, 1]:
        raise Unsupported("dilated AveragePool is not implemented")
    return [ctx.make("nn.pool2d", [x], kind=kind, kernel=tuple(kernel), strides=tuple(strides),
                     dilation=tuple(dilations), padding=tuple(pads), ceil_mode=bool(ceil),
                     count_include_pad=bool(include))]


@converter("MaxPool")
def _max_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "max")


@converter("AveragePool")
def _avg_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "avg")


def _global_pool(ctx, args, attrs, kind):
    return [ctx.make("nn.global_pool", [args[0]], kind=kind)]


converter("GlobalAveragePool")(partial(_global_pool, kind="avg"))
converter("GlobalMaxPool")(partial(_global_pool, kind="max"))


@converter("LRN")
def _lrn(ctx, args, attrs):
    size = int(attrs.get("size"))
    if size <= 0:
        raise ModelError(f"LRN size {size} must be positive")
    if len(args[0].shape) < 3:
        raise ModelError("LRN needs N, C and spatial dimensions")
    return [ctx.make("nn.lrn", [args[0]], size=size, alpha=float(attrs.get("alpha", 1e-4)),
                     beta=float(attrs.get("beta", 0.75)), bias=float(attrs.get("bias", 1.0)))]


