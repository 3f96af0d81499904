"""ONNX converters of the gathers and scatters: Gather, GatherElements, GatherND,
ScatterElements (and the older Scatter), ScatterND. Constant indices are checked here;
indices computed at run time (an embedding lookup) are checked by the kernel, an index out of
range stopping the run with a KernelError (``OpDef.checked``)."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from .onnx_common import converter, normalize_axis


def _indices(node, what):
    if node.dtype not in ("int32", "int64"):
        raise ModelError(f"{what}'s indices must be int32 or int64, got {node.dtype}")
    return node


def _check_range(indices, dims, what):
    """Constant indices (last axis over ``dims``) within ``[-dim, dim)``."""
    if not indices.is_const or not indices.size:
        return
    value, dims = indices.value, np.asarray(dims)
    if (value < -dims).any() or (value >= dims).any():
        raise ModelError(f"{what} index out of range for dimensions {dims.tolist()}")


@converter("Gather")
def _gather(ctx, args, attrs):
    x, indices = args
    axis = normalize_axis(int(attrs.get("axis", 0)), len(x.shape))
    _indices(indices, "Gather")
    if not indices.is_const:
        return [ctx.make("take", [x, indices], axis=axis)]
    dim = x.shape[axis]
    _check_range(indices, [dim], "Gather")
    index = np.where(indices.value < 0, indices.value + dim, indices.value).astype(np.int32)
    return [ctx.make("take", [x, ir.const(index, indices.name)], axis=axis)]


@converter("GatherElements", since=11)
def _gather_elements(ctx, args, attrs):
    data, indices = args[0], _indices(args[1], "GatherElements")
    axis = normalize_axis(int(attrs.get("axis", 0)), len(data.shape))
    _check_range(indices, [data.shape[axis]], "GatherElements")
    return [ctx.make("gather_elements", [data, indices], axis=axis)]


@converter("GatherND", since=11)
def _gather_nd(ctx, args, attrs):
    data, indices = args[0], _indices(args[1], "GatherND")
    batch_dims = int(attrs.get("batch_dims", 0))
    if not 0 <= batch_dims < min(len(data.shape), len(indices.shape)):
        raise ModelError(f"GatherND's batch_dims {batch_dims} is out of range")
    depth = indices.shape[-1] if indices.shape else 0
    _check_range(indices, data.shape[batch_dims:batch_dims + depth], "GatherND")
    return [ctx.make("gather_nd", [data, indices], batch_dims=batch_dims)]


def _reduction(attrs) -> str:
    reduction = attrs.get("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ModelError(f"reduction={reduction!r} is not one of ONNX's")
    return reduction


def _updates(data, updates, what):
    if updates.dtype != data.dtype:
        raise ModelError(f"{what}'s updates are {updates.dtype}, its data {data.dtype}")
    return updates


@converter("Scatter")
@converter("ScatterElements", since=11)
def _scatter_elements(ctx, args, attrs):
    """Without a reduction, of updates aimed at one element the last is kept (as onnxruntime)."""
    data, indices = args[0], _indices(args[1], "ScatterElements")
    axis = normalize_axis(int(attrs.get("axis", 0)), len(data.shape))
    _check_range(indices, [data.shape[axis]], "ScatterElements")
    return [ctx.make("scatter_elements", [data, indices, _updates(data, args[2], "ScatterElements")],
                     axis=axis, reduction=_reduction(attrs))]


@converter("ScatterND", since=11)
def _scatter_nd(ctx, args, attrs):
    data, indices = args[0], _indices(args[1], "ScatterND")
    depth = indices.shape[-1] if indices.shape else 0
    _check_range(indices, data.shape[:depth], "ScatterND")
    return [ctx.make("scatter_nd", [data, indices, _updates(data, args[2], "ScatterND")],
                     reduction=_reduction(attrs))]
