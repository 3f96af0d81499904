"""ONNX converters of the normalizations: LayerNormalization, InstanceNormalization,
GroupNormalization and LpNormalization, each one ``nn.normalize`` (or ``nn.lp_normalize``)
kernel with its scale and bias fused after it. float32 only."""
from __future__ import annotations

import math

from ..errors import ModelError
from .onnx_activation import check_dtype
from .onnx_common import Unsupported, converter, normalize_axis, reshape


def _epsilon(attrs) -> float:
    eps = float(attrs.get("epsilon", 1e-5))
    if not eps >= 0:
        raise ModelError(f"epsilon {eps} must be non-negative")
    return eps


def _stash_type(attrs) -> None:
    stash = int(attrs.get("stash_type", 1))
    if stash != 1:
        raise Unsupported(f"stash_type={stash} (statistics in float32 only)")


def _affine(ctx, y, scale, bias, shape):
    """``y * scale + bias``, both reshaped to ``shape`` (broadcasting against ``y``)."""
    y = ctx.make("multiply", [y, reshape(ctx, scale, shape)])
    if bias is not None:
        y = ctx.make("add", [y, reshape(ctx, bias, shape)])
    return y


@converter("LayerNormalization")
def _layer_norm(ctx, args, attrs):
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    check_dtype(ctx, x)
    ndim = len(x.shape)
    axis = normalize_axis(int(attrs.get("axis", -1)), ndim)
    _stash_type(attrs)
    y = ctx.make("nn.normalize", [x], axis=axis, epsilon=_epsilon(attrs))
    for what, v in (("Scale", scale), ("B", bias)):
        if v is not None and len(v.shape) > ndim - axis:
            raise ModelError(f"LayerNormalization's {what} {list(v.shape)} has more dimensions "
                             f"than the normalized {list(x.shape[axis:])}")
    y = ctx.make("multiply", [y, scale])
    return [ctx.make("add", [y, bias]) if bias is not None else y]


def _channels(x, what):
    if len(x.shape) < 3:
        raise ModelError(f"{what} needs N, C and spatial dimensions, got {list(x.shape)}")
    return (1, x.shape[1]) + (1,) * (len(x.shape) - 2)


@converter("InstanceNormalization")
def _instance_norm(ctx, args, attrs):
    x, scale, bias = args
    check_dtype(ctx, x)
    shape = _channels(x, "InstanceNormalization")
    for what, v in (("scale", scale), ("B", bias)):
        if v.size != x.shape[1]:
            raise ModelError(f"InstanceNormalization's {what} has {v.size} entries for "
                             f"{x.shape[1]} channels")
    y = ctx.make("nn.normalize", [x], axis=2, epsilon=_epsilon(attrs))
    return [_affine(ctx, y, scale, bias, shape)]


@converter("GroupNormalization")
@converter("GroupNormalization", since=21)
def _group_norm(ctx, args, attrs):
    """Opset 18's scale and bias have one entry per group, opset 21's one per channel."""
    x, scale, bias = args
    check_dtype(ctx, x)
    shape = _channels(x, "GroupNormalization")
    groups = int(attrs.get("num_groups"))
    n, c = x.shape[:2]
    if groups <= 0 or c % groups:
        raise ModelError(f"GroupNormalization: {c} channels in {groups} groups")
    if ctx.opset >= 21:
        _stash_type(attrs)
    per_channel = ctx.opset >= 21
    for what, v in (("scale", scale), ("bias", bias)):
        if v.size != (c if per_channel else groups):
            raise ModelError(f"GroupNormalization's {what} has {v.size} entries, needs "
                             f"{c if per_channel else groups} (opset {ctx.opset})")
    grouped = reshape(ctx, x, (n, groups, math.prod(x.shape[1:]) // groups))
    y = ctx.make("nn.normalize", [grouped], axis=2, epsilon=_epsilon(attrs))
    if per_channel:
        return [_affine(ctx, reshape(ctx, y, x.shape), scale, bias, shape)]
    return [reshape(ctx, _affine(ctx, y, scale, bias, (1, groups, 1)), x.shape)]


@converter("LpNormalization")
def _lp_norm(ctx, args, attrs):
    x = args[0]
    check_dtype(ctx, x)
    axis = normalize_axis(int(attrs.get("axis", -1)), len(x.shape))
    p = int(attrs.get("p", 2))
    if p not in (1, 2):
        raise Unsupported(f"p={p} (only 1 and 2)")
    return [ctx.make("nn.lp_normalize", [x], axis=axis, p=p)]
