"""Injective operators: reshape, transpose, concatenate, strided slice, pad, resize,
broadcast_to, tile, trilu."""
from __future__ import annotations

import math

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .elemwise import broadcast_index, broadcast_shape
from .registry import register, static_shape


def _reshape(ts, attrs, node):
    x = ts[0]
    src = static_shape(x)
    out = node.shape

    def body(*idx):
        flat = 0
        for i, d in zip(idx, out):
            flat = flat * d + i
        rest, index = flat, []
        for d in reversed(src):
            index.append(E.floormod(rest, d) if d != 1 else 0)
            rest = E.floordiv(rest, d) if d != 1 else rest
        return x[tuple(reversed(index))]
    return te.compute(out, body, name="reshape")


def _reshape_infer(inputs, attrs):
    shape = tuple(attrs["newshape"])
    if math.prod(shape) != inputs[0].size:
        raise ModelError(f"reshape of {list(inputs[0].shape)} to {list(shape)}: sizes differ")
    return shape, inputs[0].dtype


register("reshape", "injective", _reshape_infer, _reshape,
         fold=lambda xs, a: xs[0].reshape(a["newshape"]))


def _transpose(ts, attrs, node):
    x, axes = ts[0], attrs["axes"]
    inverse = np.argsort(axes)
    return te.compute(node.shape, lambda *i: x[tuple(i[k] for k in inverse)], name="transpose")


register("transpose", "injective",
         lambda inputs, a: (tuple(inputs[0].shape[k] for k in a["axes"]), inputs[0].dtype),
         _transpose, fold=lambda xs, a: np.transpose(xs[0], a["axes"]))


def _concat_infer(inputs, attrs):
    axis = attrs["axis"]
    first = inputs[0]
    for x in inputs[1:]:
        if len(x.shape) != len(first.shape) or any(
                a != b for k, (a, b) in enumerate(zip(x.shape, first.shape)) if k != axis):
            raise ModelError(f"concat along axis {axis}: shapes {list(first.shape)} and "
                             f"{list(x.shape)} differ elsewhere")
        if x.dtype != first.dtype:
            raise ModelError("concat of different dtypes")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in inputs)
    return tuple(shape), first.dtype


def _concat(ts, attrs, node):
    axis = attrs["axis"]
    offsets, total = [], 0
    for t in ts:
        offsets.append(total)
        total += static_shape(t)[axis]

    def body(*idx):
        out = None
        for t, off in zip(ts, offsets):     # the last input whose offset is reached
            src = tuple(i - off if k == axis else i for k, i in enumerate(idx))
            out = t[src] if out is None else E.if_then_else(idx[axis] >= off, t[src], out)
        return out
    return te.compute(node.shape, body, name="concatenate")


register("concatenate", "injective", _concat_infer, _concat,
         fold=lambda xs, a: np.concatenate(xs, axis=a["axis"]))


def _slice_infer(inputs, attrs):
    shape = list(inputs[0].shape)
    for axis, begin, end, step in attrs["slices"]:
        shape[axis] = len(range(begin, end, step))
        if shape[axis] == 0:
            raise ModelError(f"slice of axis {axis} is empty ({begin}:{end}:{step})")
    return tuple(shape), inputs[0].dtype


def _slice(ts, attrs, node):
    x = ts[0]
    spec = {axis: (begin, step) for axis, begin, _, step in attrs["slices"]}

    def body(*idx):
        return x[tuple(spec[k][0] + i * spec[k][1] if k in spec else i
                       for k, i in enumerate(idx))]
    return te.compute(node.shape, body, name="strided_slice")


def _slice_fold(xs, attrs):
    index = [slice(None)] * xs[0].ndim
    for axis, begin, end, step in attrs["slices"]:
        index[axis] = slice(begin, None if end < 0 else end, step)
    return xs[0][tuple(index)]


register("strided_slice", "injective", _slice_infer, _slice, fold=_slice_fold)


def _pad_infer(inputs, attrs):
    x = inputs[0]
    before, after = attrs["before"], attrs["after"]
    shape = tuple(d + b + a for d, b, a in zip(x.shape, before, after))
    if any(d <= 0 for d in shape):
        raise ModelError(f"pad of {list(x.shape)} by {before}/{after} leaves nothing")
    if attrs["mode"] == "reflect" and any(b >= d or a >= d for d, b, a in
                                          zip(x.shape, before, after) if b or a):
        raise ModelError("reflect padding must be smaller than the padded dimension")
    return shape, x.dtype


def _pad(ts, attrs, node):
    x = ts[0]
    dims = static_shape(x)
    before, mode = attrs["before"], attrs["mode"]
    dt = x.dtype

    def body(*idx):
        src, conds = [], []
        for i, d, b in zip(idx, dims, before):
            j = i - b
            if mode == "constant":
                conds += [j >= 0, j < d]
            elif mode == "edge":
                j = E.minimum(E.maximum(j, 0), d - 1)
            else:   # reflect
                j = E.if_then_else(j < 0, -j, j)
                j = E.if_then_else(j >= d, 2 * (d - 1) - j, j)
            src.append(j)
        if mode == "constant" and conds:
            return E.if_then_else(te.all(*conds), x[tuple(src)], te.const(attrs["value"], dt))
        return x[tuple(src)]
    return te.compute(node.shape, body, name="pad", tag="pad_op")


def _pad_fold(xs, attrs):
    widths = list(zip(attrs["before"], attrs["after"]))
    if attrs["mode"] == "constant":
        return np.pad(xs[0], widths, constant_values=attrs["value"])
    return np.pad(xs[0], widths, mode=attrs["mode"])


register("pad", "injective", _pad_infer, _pad, fold=_pad_fold)


def _broadcast_to_infer(inputs, attrs):
    return broadcast_shape(inputs[0].shape, attrs["shape"]), inputs[0].dtype


register("broadcast_to", "injective", _broadcast_to_infer,
         lambda ts, attrs, node: te.compute(node.shape, lambda *i: broadcast_index(ts[0], i),
                                            name="broadcast_to"),
         fold=lambda xs, a: np.broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, a["shape"])))


def _tile_infer(inputs, attrs):
    x, reps = inputs[0], attrs["reps"]
    if len(reps) != len(x.shape) or any(r < 1 for r in reps):
        raise ModelError(f"tile of {list(x.shape)} by {list(reps)}: one positive count per axis")
    return tuple(d * r for d, r in zip(x.shape, reps)), x.dtype


def _tile(ts, attrs, node):
    x = ts[0]
    dims = static_shape(x)
    return te.compute(node.shape, lambda *i: x[tuple(E.floormod(j, d) if r > 1 else j for j, d, r
                                                     in zip(i, dims, attrs["reps"]))],
                      name="tile")


register("tile", "injective", _tile_infer, _tile, fold=lambda xs, a: np.tile(xs[0], a["reps"]))


# ------------------------------------------------------------------ resize

def _resize_infer(inputs, attrs):
    x = inputs[0]
    return (*x.shape[:2], *attrs["size"]), x.dtype


def _source_coord(i, out_size, in_size, scale, mode):
    """Input coordinate (float) of output index ``i`` (ONNX coordinate_transformation_mode)."""
    fi = E.cast(i, "float32")
    if mode == "half_pixel":
        return (fi + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (fi + 0.5) / scale - 0.5 if out_size > 1 else fi * 0.0
    if mode == "align_corners":
        return fi * ((in_size - 1) / (out_size - 1)) if out_size > 1 else fi * 0.0
    if mode == "asymmetric":
        return fi / scale
    if mode == "tf_half_pixel_for_nn":
        return (fi + 0.5) / scale
    raise ModelError(f"Resize: coordinate_transformation_mode {mode!r} is not supported")


def _nearest(coord, mode):
    if mode == "round_prefer_floor":
        return E.cast(te.ceil(coord - 0.5), "int32")
    if mode == "round_prefer_ceil":
        return E.cast(te.floor(coord + 0.5), "int32")
    if mode == "floor":
        return E.cast(te.floor(coord), "int32")
    if mode == "ceil":
        return E.cast(te.ceil(coord), "int32")
    raise ModelError(f"Resize: nearest_mode {mode!r} is not supported")


def _resize(ts, attrs, node):
    x = ts[0]
    dims = static_shape(x)
    (oh, ow), (sh, sw) = attrs["size"], attrs["scales"]
    mode, coord_mode = attrs["mode"], attrs["coordinate_transformation_mode"]
    ih, iw = dims[2], dims[3]

    def clamp(v, n):
        return E.minimum(E.maximum(v, 0), n - 1)
    if mode == "nearest":
        def body(n, c, y, xx):
            sy = clamp(_nearest(_source_coord(y, oh, ih, sh, coord_mode), attrs["nearest_mode"]), ih)
            sx = clamp(_nearest(_source_coord(xx, ow, iw, sw, coord_mode), attrs["nearest_mode"]), iw)
            return x[n, c, sy, sx]
        return te.compute(node.shape, body, name="resize_nearest")

    def body(n, c, y, xx):
        fy = E.maximum(_source_coord(y, oh, ih, sh, coord_mode), te.const(0.0, "float32")) \
            if coord_mode != "align_corners" else _source_coord(y, oh, ih, sh, coord_mode)
        fx = E.maximum(_source_coord(xx, ow, iw, sw, coord_mode), te.const(0.0, "float32")) \
            if coord_mode != "align_corners" else _source_coord(xx, ow, iw, sw, coord_mode)
        y0f, x0f = te.floor(fy), te.floor(fx)
        wy, wx = fy - y0f, fx - x0f
        y0, x0 = clamp(E.cast(y0f, "int32"), ih), clamp(E.cast(x0f, "int32"), iw)
        y1, x1 = clamp(y0 + 1, ih), clamp(x0 + 1, iw)
        top = x[n, c, y0, x0] * (1.0 - wx) + x[n, c, y0, x1] * wx
        bottom = x[n, c, y1, x0] * (1.0 - wx) + x[n, c, y1, x1] * wx
        return top * (1.0 - wy) + bottom * wy
    return te.compute(node.shape, body, name="resize_bilinear")


register("image.resize2d", "injective", _resize_infer, _resize)


# ------------------------------------------------------------------ triangles

def _trilu(ts, attrs, node):
    x, k, upper = ts[0], attrs["k"], attrs["upper"]
    zero = te.const(0, x.dtype)

    def body(*i):
        diagonal = i[-1] - i[-2]
        keep = diagonal >= k if upper else diagonal <= k
        return E.if_then_else(keep, x[i], zero)
    return te.compute(node.shape, body, name="trilu")


def _trilu_infer(inputs, attrs):
    if len(inputs[0].shape) < 2:
        raise ModelError(f"trilu of {list(inputs[0].shape)}: at least 2 dimensions")
    return inputs[0].shape, inputs[0].dtype


register("trilu", "injective", _trilu_infer, _trilu,
         fold=lambda xs, a: (np.triu if a["upper"] else np.tril)(xs[0], a["k"]))
