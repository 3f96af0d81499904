"""Operators that read or write at indices taken from tensor values: take (Gather),
gather_elements, gather_nd, scatter_elements, scatter_nd. They are ``OpDef.checked``: their
kernels are built with run-time bound checks, and an index out of range turns into an address
before the buffer, so the run stops with a KernelError instead of touching another element."""
from __future__ import annotations

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .registry import register, static_shape


def _take_infer(inputs, attrs):
    x, ind = inputs
    axis = attrs["axis"]
    return (*x.shape[:axis], *ind.shape, *x.shape[axis + 1:]), x.dtype


def _checked_load(x, index, valid, axes):
    """``x[index]`` where the indices of ``axes`` come from tensor values: when ``valid`` does
    not hold they become -1 (the others 0), an address before the buffer, so the kernel's
    bound check (``OpDef.checked``) stops the run instead of reading another element."""
    return x[tuple(E.if_then_else(valid, i, -1 if k in axes else 0) for k, i in enumerate(index))]


def _in_range(raw, size):
    """Whether index value ``raw`` is in ``[-size, size)`` (ONNX's negative indices count from
    the end), compared in its own dtype; and the index it names, as int32. ``size`` an int or
    an int32 expression."""
    bound = te.const(size, raw.dtype) if isinstance(size, int) else E.cast(size, raw.dtype)
    valid = E.logical_and(raw >= -bound, raw < bound)
    j = E.cast(raw, "int32")
    return valid, E.if_then_else(j < 0, j + size, j)


def _take(ts, attrs, node):
    x, ind = ts
    axis = attrs["axis"]
    nind = len(node.inputs[1].shape)
    size = static_shape(x)[axis]

    def body(*idx):
        valid, j = _in_range(ind[tuple(idx[axis:axis + nind])], size)
        return _checked_load(x, (*idx[:axis], j, *idx[axis + nind:]), valid, {axis})
    return te.compute(node.shape, body, name="take")


register("take", "injective", _take_infer, _take,
         fold=lambda xs, a: np.take(xs[0], xs[1], axis=a["axis"]), checked=True)


def _gather_elements_infer(inputs, attrs):
    data, ind = inputs
    axis = attrs["axis"]
    if len(ind.shape) != len(data.shape) or any(
            i > d for k, (i, d) in enumerate(zip(ind.shape, data.shape)) if k != axis):
        raise ModelError(f"gather_elements of {list(data.shape)} by indices of "
                         f"{list(ind.shape)}: the ranks must agree, and the other dimensions "
                         "must not exceed the data's")
    return ind.shape, data.dtype


def _gather_elements(ts, attrs, node):
    data, ind = ts
    axis = attrs["axis"]
    size = static_shape(data)[axis]

    def body(*idx):
        valid, j = _in_range(ind[idx], size)
        return _checked_load(data, (*idx[:axis], j, *idx[axis + 1:]), valid, {axis})
    return te.compute(node.shape, body, name="gather_elements")


def _gather_elements_fold(xs, attrs):
    data, ind = xs
    axis = attrs["axis"]
    ind = np.where(ind < 0, ind + data.shape[axis], ind)
    return np.take_along_axis(data[tuple(slice(0, d) if k != axis else slice(None)
                                         for k, d in enumerate(ind.shape))], ind, axis)


register("gather_elements", "injective", _gather_elements_infer, _gather_elements,
         fold=_gather_elements_fold, checked=True)


def _gather_nd_infer(inputs, attrs):
    data, ind = inputs
    b = attrs["batch_dims"]
    if not ind.shape or ind.shape[:b] != data.shape[:b] or \
            not 1 <= ind.shape[-1] <= len(data.shape) - b:
        raise ModelError(f"gather_nd of {list(data.shape)} by indices of {list(ind.shape)} "
                         f"with batch_dims={b}")
    return (*ind.shape[:-1], *data.shape[b + ind.shape[-1]:]), data.dtype


def _gather_nd(ts, attrs, node):
    data, ind = ts
    b = attrs["batch_dims"]
    ind_shape, dims = static_shape(ind), static_shape(data)
    depth, lead = ind_shape[-1], len(ind_shape) - 1

    def body(*idx):
        picked, valid = [], None
        for k in range(depth):
            ok, j = _in_range(ind[(*idx[:lead], k)], dims[b + k])
            picked.append(j)
            valid = ok if valid is None else E.logical_and(valid, ok)
        index = (*idx[:b], *picked, *idx[lead:])
        return _checked_load(data, index, valid, set(range(b, b + depth)))
    return te.compute(node.shape, body, name="gather_nd")


def _gather_nd_fold(xs, attrs):
    data, ind = xs
    b = attrs["batch_dims"]
    depth = ind.shape[-1]
    ind = np.where(ind < 0, ind + np.asarray(data.shape[b:b + depth]), ind)
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    flat_data = data.reshape(batch, *data.shape[b:])
    flat_ind = ind.reshape(batch, -1, depth)
    out = np.stack([flat_data[n][tuple(flat_ind[n].T)] for n in range(batch)])
    return out.reshape(*ind.shape[:-1], *data.shape[b + depth:])


register("gather_nd", "injective", _gather_nd_infer, _gather_nd, fold=_gather_nd_fold,
         checked=True)


# ------------------------------------------------------------------ scatters

#: reduction -> (combine two values, the identity's expression for a dtype, numpy's ufunc)
_COMBINE = {"add": (lambda a, b: a + b, lambda dt: te.const(0, dt), np.add),
            "mul": (lambda a, b: a * b, lambda dt: te.const(1, dt), np.multiply),
            "max": (E.maximum, E.min_value, np.maximum),
            "min": (E.minimum, E.max_value, np.minimum)}
_PRODUCT = te.comm_reducer(lambda x, y: x * y, lambda dtype: te.const(1, dtype), "prod")
_REDUCER = {"add": te.sum, "mul": _PRODUCT, "max": te.max, "min": te.min}


def _targets(ind, size_of):
    """The indices as int32 positions (negative ones counted from the end), a stage of their
    own; ``size_of(q)`` the extent index ``q`` addresses. An index outside ``[-size, size)``
    reads before the indices' buffer, which the kernel's bound check refuses."""
    def body(*q):
        valid, j = _in_range(ind[q], size_of(q))
        return E.if_then_else(valid, j, E.cast(ind[tuple(-1 for _ in q)], "int32"))
    return te.compute(static_shape(ind), body, name="scatter_targets")


def _scatter(data, upd, node, reduction, extent, matches, source):
    """``data`` with the updates written: for output ``p``, the updates at the positions ``m``
    (over ``extent``) where ``matches(p, m)``, read at ``source(p, m)``; the last one wins
    without a reduction, else all are combined with the data's element."""
    m = te.reduce_axis((0, extent), "m")
    dt = node.dtype
    if reduction == "none":
        last = te.compute(node.shape, lambda *p: te.max(E.if_then_else(
            matches(p, m.var), m.var, te.const(-1, "int32")), axis=m), name="scatter_last")
        return te.compute(node.shape, lambda *p: E.if_then_else(
            last[p] >= 0, upd[source(p, last[p])], data[p]), name="scatter")
    combine, identity, _ = _COMBINE[reduction]
    acc = te.compute(node.shape, lambda *p: _REDUCER[reduction](E.if_then_else(
        matches(p, m.var), upd[source(p, m.var)], identity(dt)), axis=m), name="scatter_acc")
    return te.compute(node.shape, lambda *p: combine(data[p], acc[p]), name="scatter")


def _scatter_elements_infer(inputs, attrs):
    data, ind, upd = inputs
    _gather_elements_infer([data, ind], attrs)
    if upd.shape != ind.shape or upd.dtype != data.dtype:
        raise ModelError(f"scatter_elements: updates {list(upd.shape)} {upd.dtype} must have the "
                         f"indices' shape {list(ind.shape)} and the data's dtype {data.dtype}")
    return data.shape, data.dtype


def _scatter_elements(ts, attrs, node):
    data, ind, upd = ts
    axis = attrs["axis"]
    dims, ishape = static_shape(data), static_shape(ind)
    target = _targets(ind, lambda q: dims[axis])
    short = [k for k in range(len(dims)) if k != axis and ishape[k] < dims[k]]

    def source(p, r):
        return tuple(r if k == axis else E.minimum(p[k], ishape[k] - 1) if k in short else p[k]
                     for k in range(len(dims)))

    def matches(p, r):
        hit = target[source(p, r)] == p[axis]
        return E.all_of(hit, *(p[k] < ishape[k] for k in short))
    return _scatter(data, upd, node, attrs["reduction"], ishape[axis], matches, source)


def _scatter_elements_fold(xs, attrs):
    data, ind, upd = xs
    axis = attrs["axis"]
    ind = np.where(ind < 0, ind + data.shape[axis], ind)
    out = data.copy()
    for q in np.ndindex(*ind.shape):
        p = tuple(int(ind[q]) if k == axis else i for k, i in enumerate(q))
        out[p] = _fold_one(out[p], upd[q], attrs["reduction"])
    return out


def _fold_one(old, new, reduction):
    return new if reduction == "none" else _COMBINE[reduction][2](old, new)


register("scatter_elements", "anchor", _scatter_elements_infer, _scatter_elements,
         fold=_scatter_elements_fold, checked=True)


def _scatter_nd_infer(inputs, attrs):
    data, ind, upd = inputs
    depth = ind.shape[-1] if ind.shape else 0
    if not 1 <= depth <= len(data.shape) or \
            upd.shape != (*ind.shape[:-1], *data.shape[depth:]) or upd.dtype != data.dtype:
        raise ModelError(f"scatter_nd of {list(data.shape)} by indices of {list(ind.shape)} "
                         f"and updates of {list(upd.shape)} {upd.dtype}")
    return data.shape, data.dtype


def _scatter_nd(ts, attrs, node):
    data, ind, upd = ts
    dims, ishape = static_shape(data), static_shape(ind)
    lead, depth = ishape[:-1], ishape[-1]

    def size_of(q):
        size = te.const(dims[depth - 1], "int32")
        for k in reversed(range(depth - 1)):
            size = E.if_then_else(q[-1] == k, te.const(dims[k], "int32"), size)
        return size
    target = _targets(ind, size_of)

    def position(m):
        """The update's index in the indices' leading dimensions, from its flat number."""
        out, rest = [], m
        for d in reversed(lead):
            out.append(E.floormod(rest, d) if d != 1 else 0)
            rest = E.floordiv(rest, d) if d != 1 else rest
        return tuple(reversed(out))

    def source(p, m):
        return (*position(m), *p[depth:])

    def matches(p, m):
        return E.all_of(*(target[(*position(m), k)] == p[k] for k in range(depth)))
    extent = int(np.prod(lead, dtype=np.int64))
    return _scatter(data, upd, node, attrs["reduction"], extent, matches, source)


def _scatter_nd_fold(xs, attrs):
    data, ind, upd = xs
    depth = ind.shape[-1]
    ind = np.where(ind < 0, ind + np.asarray(data.shape[:depth]), ind)
    out = data.copy()
    for q in np.ndindex(*ind.shape[:-1]):
        p = tuple(int(v) for v in ind[q])
        out[p] = _fold_one(out[p], upd[q], attrs["reduction"])
    return out


register("scatter_nd", "anchor", _scatter_nd_infer, _scatter_nd, fold=_scatter_nd_fold,
         checked=True)
