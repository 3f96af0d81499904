"""Selections and reductions along one axis, and Einstein summation: ``argreduce`` (argmax and
argmin), ``hardmax``, ``topk``, ``cumsum``, ``einsum``.

Indices are int64 (what ONNX returns). Ties go to the lowest index, as onnxruntime's (the
highest for argmax/argmin's ``select_last_index``)."""
from __future__ import annotations

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .registry import register, static_shape


def _along(idx, axis, value):
    """``idx`` with its ``axis`` entry replaced by ``value``."""
    return tuple(value if k == axis else v for k, v in enumerate(idx))


def _extreme_index(x, axis, kind, last, name):
    """``[..., 1, ...]`` int32 stage: the index of the max (min) along ``axis``; two
    reductions, the extreme value, then the first (last) index that holds it."""
    dims = static_shape(x)
    n = dims[axis]
    shape = _along(dims, axis, 1)
    r1 = te.reduce_axis((0, n), "r1")
    reducer = te.max if kind == "max" else te.min
    best = te.compute(shape, lambda *i: reducer(x[_along(i, axis, r1)], axis=r1),
                      name=f"{name}_value", tag="reduce")
    r2 = te.reduce_axis((0, n), "r2")

    def index(*i):
        hit = x[_along(i, axis, r2)] == best[i]
        if last:
            return te.max(E.if_then_else(hit, r2.var, te.const(-1, "int32")), axis=r2)
        return te.min(E.if_then_else(hit, r2.var, te.const(n, "int32")), axis=r2)
    return te.compute(shape, index, name=f"{name}_index", tag="reduce")


def _argreduce_infer(inputs, attrs):
    x = inputs[0]
    axis = attrs["axis"]
    if attrs["keepdims"]:
        return _along(x.shape, axis, 1), "int64"
    return tuple(d for k, d in enumerate(x.shape) if k != axis), "int64"


def _argreduce(ts, attrs, node):
    axis = attrs["axis"]
    found = _extreme_index(ts[0], axis, attrs["kind"], attrs["select_last_index"], "arg")
    keep = attrs["keepdims"]
    return te.compute(node.shape, lambda *i: E.cast(
        found[i if keep else i[:axis] + (0,) + i[axis:]], "int64"), name=f"arg{attrs['kind']}")


def _argreduce_fold(xs, attrs):
    x, axis = xs[0], attrs["axis"]
    fn = np.argmax if attrs["kind"] == "max" else np.argmin
    if attrs["select_last_index"]:
        flipped = np.flip(x, axis)
        out = x.shape[axis] - 1 - fn(flipped, axis=axis)
    else:
        out = fn(x, axis=axis)
    return np.expand_dims(out, axis).astype(np.int64) if attrs["keepdims"] else \
        out.astype(np.int64)


register("argreduce", "anchor", _argreduce_infer, _argreduce, fold=_argreduce_fold,
         flops=lambda node: 2 * node.inputs[0].size)


def _hardmax(ts, attrs, node):
    x, axis = ts[0], attrs["axis"]
    found = _extreme_index(x, axis, "max", False, "hardmax")
    one, zero = te.const(1, x.dtype), te.const(0, x.dtype)
    return te.compute(node.shape, lambda *i: E.if_then_else(
        found[_along(i, axis, 0)] == i[axis], one, zero), name="hardmax")


def _hardmax_fold(xs, attrs):
    x, axis = xs[0], attrs["axis"]
    first = np.expand_dims(np.argmax(x, axis=axis), axis)
    positions = np.arange(x.shape[axis]).reshape(_along([1] * x.ndim, axis, -1))
    return (positions == first).astype(x.dtype)


register("hardmax", "anchor", lambda inputs, a: (inputs[0].shape, inputs[0].dtype), _hardmax,
         fold=_hardmax_fold, flops=lambda node: 2 * node.size)


# ------------------------------------------------------------------ top-k


def _topk_infer(inputs, attrs):
    x = inputs[0]
    shape = _along(x.shape, attrs["axis"], attrs["k"])
    return shape, x.dtype if attrs["output"] == "values" else "int64"


def _topk(ts, attrs, node):
    """Each element's rank along the axis (how many elements come before it: larger, or equal
    at a lower index, for ``largest``), then output ``p`` is the element of rank ``p``.
    O(n^2) per row: the axis is bounded by the converter."""
    x, axis = ts[0], attrs["axis"]
    n = static_shape(x)[axis]
    rj = te.reduce_axis((0, n), "rj")

    def before(*i):
        other, mine = x[_along(i, axis, rj)], x[i]
        ahead = other > mine if attrs["largest"] else other < mine
        return te.sum(E.if_then_else(ahead | ((other == mine) & (rj.var < i[axis])),
                                     te.const(1, "int32"), te.const(0, "int32")), axis=rj)
    rank = te.compute(static_shape(x), before, name="topk_rank", tag="reduce")
    ri = te.reduce_axis((0, n), "ri")
    if attrs["output"] == "values":
        def pick(*p):
            return te.sum(E.if_then_else(rank[_along(p, axis, ri)] == p[axis],
                                         x[_along(p, axis, ri)], te.const(0, x.dtype)), axis=ri)
        return te.compute(node.shape, pick, name="topk_values", tag="reduce")

    def pick_index(*p):
        return te.sum(E.if_then_else(rank[_along(p, axis, ri)] == p[axis],
                                     E.cast(ri.var, "int64"), te.const(0, "int64")), axis=ri)
    return te.compute(node.shape, pick_index, name="topk_indices", tag="reduce")


def _topk_fold(xs, attrs):
    x, axis, k = xs[0], attrs["axis"], attrs["k"]
    order = np.argsort(-x if attrs["largest"] else x, axis=axis, kind="stable")
    order = np.take(order, np.arange(k), axis=axis)
    if attrs["output"] == "indices":
        return order.astype(np.int64)
    return np.take_along_axis(x, order, axis=axis)


register("topk", "anchor", _topk_infer, _topk, fold=_topk_fold,
         flops=lambda node: node.inputs[0].size * (node.inputs[0].shape[node.attrs["axis"]] + 1))


# ------------------------------------------------------------------ cumulative sum


def _cumsum(ts, attrs, node):
    """``out[i] = sum of x[j]`` for ``j <= i`` (``j >= i`` reversed; strictly for
    ``exclusive``); a masked reduction over the whole axis."""
    x, axis = ts[0], attrs["axis"]
    n = static_shape(x)[axis]
    r = te.reduce_axis((0, n), "r")

    def body(*i):
        j, at = r.var, i[axis]
        if attrs["reverse"]:
            take = j > at if attrs["exclusive"] else j >= at
        else:
            take = j < at if attrs["exclusive"] else j <= at
        return te.sum(E.if_then_else(take, x[_along(i, axis, r)], te.const(0, x.dtype)), axis=r)
    return te.compute(node.shape, body, name="cumsum", tag="reduce")


def _cumsum_fold(xs, attrs):
    x, axis = xs[0], attrs["axis"]
    src = np.flip(x, axis) if attrs["reverse"] else x
    out = np.cumsum(src, axis=axis, dtype=x.dtype)
    if attrs["exclusive"]:
        out = out - src
    return np.flip(out, axis) if attrs["reverse"] else out


register("cumsum", "anchor", lambda inputs, a: (inputs[0].shape, inputs[0].dtype), _cumsum,
         fold=_cumsum_fold, flops=lambda node: node.size * node.shape[node.attrs["axis"]])


# ------------------------------------------------------------------ einsum


def _einsum_infer(inputs, attrs):
    terms, out = attrs["terms"], attrs["output"]
    sizes = {}
    if len(terms) != len(inputs):
        raise ModelError(f"einsum: {len(terms)} operands in the equation, {len(inputs)} given")
    for term, x in zip(terms, inputs):
        if len(term) != len(x.shape):
            raise ModelError(f"einsum: operand {term!r} of {list(x.shape)}")
        for letter, d in zip(term, x.shape):
            if sizes.setdefault(letter, d) != d:
                raise ModelError(f"einsum: index {letter!r} is {sizes[letter]} and {d}")
        if x.dtype != inputs[0].dtype:
            raise ModelError("einsum of different dtypes")
    return tuple(sizes[letter] for letter in out), inputs[0].dtype


def _einsum(ts, attrs, node):
    """``out[output letters] = sum over the other letters of the product of the operands``."""
    terms, out = attrs["terms"], attrs["output"]
    sizes = {}
    for term, t in zip(terms, ts):
        sizes.update(zip(term, static_shape(t)))
    summed = sorted(set("".join(terms)) - set(out))
    raxes = {letter: te.reduce_axis((0, sizes[letter]), f"r_{letter}") for letter in summed}

    def body(*i):
        index = dict(zip(out, i))
        index.update(raxes)
        product = None
        for term, t in zip(terms, ts):
            v = t[tuple(index[letter] for letter in term)]
            product = v if product is None else product * v
        return te.sum(product, axis=list(raxes.values())) if raxes else product
    return te.compute(node.shape, body, name="einsum", tag="reduce" if raxes else "")


def _einsum_flops(node):
    letters = set("".join(node.attrs["terms"]))
    sizes = {}
    for term, x in zip(node.attrs["terms"], node.inputs):
        sizes.update(zip(term, x.shape))
    return 2 * int(np.prod([sizes[letter] for letter in letters]))


register("einsum", "anchor", _einsum_infer, _einsum,
         fold=lambda xs, a: np.einsum(f"{','.join(a['terms'])}->{a['output']}", *xs),
         flops=_einsum_flops)
