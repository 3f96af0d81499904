"""Normalization over trailing axes: ``nn.normalize`` (zero mean and unit variance, the core of
layer, instance and group normalization; scale and bias are elementwise operators after it,
which fuse into its kernel) and ``nn.lp_normalize`` (division by the L1 or L2 norm).

Each reduces a row once for its mean and once for its variance (two passes, not the
sum-of-squares shortcut, whose cancellation loses digits when the mean is large)."""
from __future__ import annotations

import math

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .registry import register, static_shape
from .rows import is_long_row, lane_reduce


def _same_infer(inputs, attrs):
    x = inputs[0]
    if not 0 <= attrs["axis"] < len(x.shape):
        raise ModelError(f"normalization axis {attrs['axis']} of {list(x.shape)}")
    return x.shape, x.dtype


def _row_reduce(x, axis, body, name):
    """A ``[..., 1, 1]`` stage: ``sum(body(x at the row's element))`` over axes ``axis..``."""
    dims = static_shape(x)
    raxes = [te.reduce_axis((0, d), f"r{k}") for k, d in enumerate(dims[axis:])]
    shape = tuple(dims[:axis]) + (1,) * (len(dims) - axis)
    return te.compute(shape, lambda *i: te.sum(body(i[:axis] + tuple(raxes)), axis=raxes),
                      name=name, tag="reduce")


def _row(i, axis):
    return tuple(i[:axis]) + (0,) * (len(i) - axis)


def _normalize(ts, attrs, node):
    """Over a long row (the trailing axes from ``axis``: LayerNormalization's last axis,
    InstanceNormalization's map), the sums in partial lanes (:func:`.rows.lane_reduce`) and
    the product by the reciprocal of the deviation (one division a row, as onnxruntime's;
    within an ulp of the quotient). One thread, AVX-512 code: 128 rows of 256 47 -> 6 us,
    64 maps of 56 x 56 347 -> 36 us, AVX2 code 37 (each row's sums had been one serial add
    an element)."""
    x = ts[0]
    axis, dt = attrs["axis"], x.dtype
    dims = static_shape(x)
    count = te.const(1.0 / math.prod(dims[axis:]), dt)
    eps = te.const(attrs["epsilon"], dt)
    long_row = is_long_row(dims, axis)

    def row_sum(body, name):
        if long_row:
            return lane_reduce(te.sum, x, axis, body, 0.0, name)
        return _row_reduce(x, axis, body, name)

    def centered(j):
        return x[j] - mean[_row(j, axis)]
    total = row_sum(lambda j: x[j], "normalize_sum")
    mean = te.compute(total.shape, lambda *i: total[i] * count, name="normalize_mean")
    squares = row_sum(lambda j: centered(j) * centered(j), "normalize_sqsum")

    def deviation(i):
        return te.sqrt(squares[_row(i, axis)] * count + eps)
    if long_row:
        return te.compute(node.shape, lambda *i: centered(i) * (
            te.const(1.0, dt) / deviation(i)), name="normalize")
    return te.compute(node.shape, lambda *i: centered(i) / deviation(i), name="normalize")


def _normalize_fold(xs, attrs):
    x = xs[0]
    axes = tuple(range(attrs["axis"], x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return ((x - mean) / np.sqrt(var + attrs["epsilon"])).astype(x.dtype)


register("nn.normalize", "anchor", _same_infer, _normalize, fold=_normalize_fold,
         flops=lambda node: 8 * node.size)


def _lp_normalize(ts, attrs, node):
    """``x / ||x||_p`` along one axis; a zero norm gives 0 (as onnxruntime)."""
    x = ts[0]
    axis, dt = attrs["axis"], x.dtype
    dims = static_shape(x)
    r = te.reduce_axis((0, dims[axis]), "r")
    shape = tuple(1 if k == axis else d for k, d in enumerate(dims))

    def at(i):
        return tuple(r if k == axis else v for k, v in enumerate(i))

    def term(v):
        return te.abs(v) if attrs["p"] == 1 else v * v
    total = te.compute(shape, lambda *i: te.sum(term(x[at(i)]), axis=r), name="lp_norm_sum",
                       tag="reduce")

    def body(*i):
        s = total[tuple(0 if k == axis else v for k, v in enumerate(i))]
        norm = s if attrs["p"] == 1 else te.sqrt(s)
        zero = te.const(0, dt)
        return E.if_then_else(norm == zero, zero, x[i] / norm)
    return te.compute(node.shape, body, name="lp_normalize")


def _lp_normalize_fold(xs, attrs):
    x = xs[0]
    norm = np.linalg.norm(x, ord=attrs["p"], axis=attrs["axis"], keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norm == 0, 0, x / norm).astype(x.dtype)


register("nn.lp_normalize", "anchor", _same_infer, _lp_normalize, fold=_lp_normalize_fold,
         flops=lambda node: 3 * node.size)
