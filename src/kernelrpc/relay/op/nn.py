"""Network operators: convolution, dense and batched matmul, pooling, LRN, softmax, reductions.

Each compute is the plain definition; :mod:`kernelrpc.relay.schedule` finds its stages by
their tags (``conv2d``, ``pad``, ``dense``...) to schedule them.
"""
from __future__ import annotations

import math

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from . import winograd
from .registry import register, static_shape
from .rows import is_long_row, lane_reduce
from .weight_layout import WeightLayout


def pad_stage(data, before, after, value=0.0, name="pad", dilation=None):
    """``data`` padded on its trailing spatial dimensions (``before``/``after`` per dimension;
    negative crops). With ``dilation`` (ConvTranspose), ``s - 1`` zeros between input elements."""
    shape = static_shape(data)
    nsp = len(before)
    lead = len(shape) - nsp
    strides = dilation or [1] * nsp
    full = [(shape[lead + k] - 1) * strides[k] + 1 for k in range(nsp)]
    out = shape[:lead] + [full[k] + before[k] + after[k] for k in range(nsp)]
    if all(b == 0 for b in before) and all(a == 0 for a in after) and strides == [1] * nsp:
        return data
    dt = data.dtype

    def body(*idx):
        conds, src = [], list(idx[:lead])
        for k in range(nsp):
            i = idx[lead + k] - before[k]
            conds += [i >= 0, i < full[k]]
            if strides[k] > 1:
                conds.append(E.floormod(i, strides[k]) == 0)
                i = E.floordiv(i, strides[k])
            src.append(i)
        return E.if_then_else(te.all(*conds), data[tuple(src)], te.const(value, dt))
    return te.compute(tuple(out), body, name=name, tag="pad")


# ------------------------------------------------------------------ conv2d


def _conv_out(size, k, s, d, pb, pe):
    return (size + pb + pe - ((k - 1) * d + 1)) // s + 1


def _conv2d_infer(inputs, attrs):
    data, weight = inputs[:2]
    if len(data.shape) != 4 or len(weight.shape) != 4:
        raise ModelError(f"conv2d needs 4-D data and weight, got {list(data.shape)} and "
                         f"{list(weight.shape)}")
    n, c, h, w = data.shape
    oc, cg, kh, kw = weight.shape
    g = attrs["groups"]
    if c % g or oc % g or cg * g != c:
        raise ModelError(f"conv2d: {c} input channels, weight {list(weight.shape)} and "
                         f"group={g} do not agree")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    up = attrs.get("upsample", (1, 1))
    h, w = (h - 1) * up[0] + 1, (w - 1) * up[1] + 1
    oh, ow = _conv_out(h, kh, sh, dh, pt, pb), _conv_out(w, kw, sw, dw, pl, pr)
    if oh <= 0 or ow <= 0:
        raise ModelError(f"conv2d: output would be {oh}x{ow} for input {h}x{w}, kernel "
                         f"{kh}x{kw}")
    return (n, oc, oh, ow), data.dtype


def phase_stage(data, before, after, strides, name="pad"):
    """``data`` zero-padded and split into its ``strides`` phases:
    ``out[n, c, py, px, yy, xx] = padded[n, c, yy * sh + py, xx * sw + px]``. A strided
    convolution reads each phase at consecutive columns (vector loads) where it would read the
    padded input every ``sw``-th element (gathers)."""
    n, c, h, w = static_shape(data)
    (sh, sw), (pt, pl), (pb, pr) = strides, before, after
    shape = (n, c, sh, sw, -(-(h + pt + pb) // sh), -(-(w + pl + pr) // sw))

    def body(b, ch, py, px, yy, xx):
        iy, ix = yy * sh + py - pt, xx * sw + px - pl
        inside = te.all(iy >= 0, iy < h, ix >= 0, ix < w)
        return E.if_then_else(inside, data[b, ch, iy, ix], te.const(0, data.dtype))
    return te.compute(shape, body, name=name, tag="pad")


def conv_window(data, attrs, ry, rx, pad=None, name="pad"):
    """``window(n, c, y, x)``: what a convolution's tap ``(ry, rx)`` reads for output
    ``(n, c, y, x)``; a strided layer's input from its phases (:func:`phase_stage`, read in
    consecutive vectors), else from ``pad(before, after)``'s padded input (by default
    :func:`pad_stage`, spread by ``attrs["upsample"]``)."""
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    if (sh, sw) != (1, 1) and "upsample" not in attrs and min(pt, pl, pb, pr) >= 0:
        phased = phase_stage(data, [pt, pl], [pb, pr], (sh, sw), name=name)

        def window(n, c, y, x):
            return phased[n, c, E.floormod(ry * dh, sh), E.floormod(rx * dw, sw),
                          y + E.floordiv(ry * dh, sh), x + E.floordiv(rx * dw, sw)]
        return window
    if pad is None:
        def pad(before, after):
            return pad_stage(data, before, after, dilation=list(attrs.get("upsample", (1, 1))))
    padded = pad([pt, pl], [pb, pr])

    def window(n, c, y, x):
        return padded[n, c, y * sh + ry * dh, x * sw + rx * dw]
    return window


def _conv2d(ts, attrs, node):
    data, weight = ts[:2]
    _, oc, oh, ow = node.shape
    g = attrs["groups"]
    layout = WeightLayout.of(attrs)
    if layout.kind == "winograd":
        return winograd.conv2d(lambda before, after: pad_stage(data, before, after), weight,
                               node, layout.m, layout.lanes)
    if layout.kind == "pointwise":
        return _conv2d_pixels(data, weight, node, layout)
    lanes = layout.lanes
    _, cg, kh, kw = static_shape(weight)[:4]
    rc = te.reduce_axis((0, cg), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    ocg = oc // g

    def channel(o):
        return rc if g == 1 else E.floordiv(o, ocg) * cg + rc
    window = conv_window(data, attrs, ry, rx)
    if not lanes:
        return te.compute(node.shape, lambda n, o, y, x: te.sum(
            window(n, channel(o), y, x) * weight[o, rc, ry, rx], axis=[rc, ry, rx]),
            name="conv2d", tag="conv2d")
    if layout.kind == "grouped":
        return _conv2d_grouped_blocks(window, weight, node, layout, (rc, ry, rx))
    if g != 1 or oc % lanes or len(weight.shape) != 5:
        raise ModelError(f"conv2d: kernel_layout {attrs['kernel_layout']} needs groups=1, "
                         f"output channels a multiple of {lanes} and the packed weight")
    # the output channels blocked ([n][O/V][h][w][V]: a vector of V channels per position),
    # read back as NCHW by the (inlined) output stage
    blocked = te.compute(
        (node.shape[0], oc // lanes, oh, ow, lanes), lambda n, ob, y, x, v: te.sum(
            window(n, channel(ob * lanes + v), y, x) * weight[ob, rc, ry, rx, v],
            axis=[rc, ry, rx]),
        name="conv2d_blocked", tag="conv2d")
    return te.compute(node.shape, lambda n, o, y, x: blocked[
        n, E.floordiv(o, lanes), y, x, E.floormod(o, lanes)], name="conv2d", tag="conv2d_unblock")


def _conv2d_pixels(data, weight, node, layout: WeightLayout):
    """A pointwise convolution as the product of its ``[O][I]`` weight (with ``layout.m``,
    its blocks of rows ``[O/m][I][m]``) and its input's ``[I][H*W]`` pixels (``[n][O][H*W]``:
    each channel's rows are one contiguous run), read back as NCHW by the (inlined) output
    stage.

    With panels (``layout.lanes`` pixels, a vector's width) the product reads its input from
    a stage of its own (tagged ``pad``), ``[n][P/V][I][V]``: a tile's pixels, channel after
    channel, one contiguous run, the last panel's pixels past the map zeros. Read in place, a
    tile's pixels of each channel lie a whole map apart (196 bytes on 7x7) and most of its
    vector loads span two cache lines (:func:`..strategy.pointwise.pixels_layout`). With
    ``layout.padded`` the product runs over whole panels (its last tile whole vectors).
    Without panels (a scalar target) a strided layer reads the pixels it keeps from a stage
    of their own."""
    n_, oc, oh, ow = node.shape
    attrs = node.attrs
    shape = tuple(static_shape(weight))
    if layout.m and (layout.out_channels != oc or shape != layout.shape((oc, *shape[1:2], 1, 1))):
        raise ModelError(f"conv2d: kernel_layout {attrs['kernel_layout']} does not fit the layer "
                         f"({oc} output channels, weight {list(shape)})")
    if tuple(layout.model_shape(shape)[2:]) != (1, 1) or any(attrs["padding"]) or \
            attrs["groups"] != 1 or "upsample" in attrs:
        raise ModelError(f"conv2d: kernel_layout {attrs['kernel_layout']} needs a 1x1 kernel, "
                         f"no padding and one group")
    sh, sw = attrs["strides"]
    channels = static_shape(data)[1]
    count = oh * ow

    def kept(n, c, p):
        return data[n, c, E.floordiv(p, ow) * sh, E.floormod(p, ow) * sw]
    width = layout.lanes
    if width:
        panels = te.compute(
            (n_, -(-count // width), channels, width),
            lambda n, t, c, v: E.if_then_else(t * width + v < count, kept(n, c, t * width + v),
                                              te.const(0, data.dtype)),
            name="pixel_panels", tag="pad")

        def pixel(n, c, p):
            return panels[n, E.floordiv(p, width), c, E.floormod(p, width)]
    elif (sh, sw) != (1, 1):
        kept_stage = te.compute((n_, channels, oh, ow),
                                lambda n, c, y, x: data[n, c, y * sh, x * sw],
                                name="subsample", tag="pad")

        def pixel(n, c, p):
            return kept_stage[n, c, E.floordiv(p, ow), E.floormod(p, ow)]
    else:
        pixel = kept
    row = -(-count // width) * width if layout.padded else count
    rc = te.reduce_axis((0, shape[1]), "rc")
    rows = layout.m

    def weight_of(o):
        if rows:
            return weight[E.floordiv(o, rows), rc, E.floormod(o, rows)]
        return weight[o, rc, 0, 0]
    pixels = te.compute(
        (n_, oc, row), lambda n, o, p: te.sum(pixel(n, rc, p) * weight_of(o), axis=rc),
        name="conv2d_pixels", tag="conv2d")
    return te.compute(node.shape, lambda n, o, y, x: pixels[n, o, y * ow + x], name="conv2d",
                      tag="conv2d_unblock")


def _conv2d_grouped_blocks(window, weight, node, layout, reduce_axes):
    """A grouped convolution with its weight in the ``grouped`` layout: ``[n][G*B][h][w][V]``,
    block ``b`` the ``V`` channels of group ``b // B`` from its ``(b % B) * V``-th (the last
    block's lanes past the group's channels computed from zero weights), so that one input
    value feeds every lane; read back as NCHW by the output stage."""
    n_, oc, oh, ow = node.shape
    cg = static_shape(weight)[1]
    lanes, groups, blocks = layout.lanes, layout.groups, layout.group_blocks
    ocg = oc // groups
    if (groups, oc) != (node.attrs["groups"], layout.out_channels) or \
            tuple(static_shape(weight)) != layout.shape((oc, *static_shape(weight)[1:4])):
        raise ModelError(f"conv2d: kernel_layout {layout.attr} does not fit the layer "
                         f"(groups={node.attrs['groups']}, {oc} output channels, weight "
                         f"{list(static_shape(weight))})")
    rc, ry, rx = reduce_axes
    blocked = te.compute(
        (n_, groups * blocks, oh, ow, lanes), lambda n, b, y, x, v: te.sum(
            window(n, E.floordiv(b, blocks) * cg + rc, y, x) * weight[b, rc, ry, rx, v],
            axis=[rc, ry, rx]), name="conv2d_blocked", tag="conv2d")

    def unblock(n, o, y, x):
        within = E.floormod(o, ocg)
        return blocked[n, E.floordiv(o, ocg) * blocks + E.floordiv(within, lanes), y, x,
                       E.floormod(within, lanes)]
    return te.compute(node.shape, unblock, name="conv2d", tag="conv2d_unblock")


def _conv2d_flops(node):
    """The direct convolution's count, whatever the weight's layout."""
    oihw = WeightLayout.of(node.attrs).model_shape(node.inputs[1].shape)
    return 2 * node.size * math.prod(oihw[1:4])


register("nn.conv2d", "anchor", _conv2d_infer, _conv2d, flops=_conv2d_flops)


# ------------------------------------------------------------------ dense / matmul


def _dense_infer(inputs, attrs):
    x, w = inputs
    layout = WeightLayout.of(attrs)
    if layout.kind not in ("OIHW", "panels"):
        raise ModelError(f"dense: kernel_layout {layout.attr} is a convolution's")
    fits = len(x.shape) == 2 and len(w.shape) == (3 if layout else 2)
    kn = layout.model_shape(w.shape) if fits else None
    if not fits or x.shape[1] != kn[0] or layout and tuple(w.shape) != layout.shape(kn):
        raise ModelError(f"dense: shapes {list(x.shape)} and {list(w.shape)} "
                         f"({layout.attr}) do not multiply")
    return (x.shape[0], kn[1]), x.dtype


def _dense(ts, attrs, node):
    """``x @ w``; a weight in ``panels`` (:class:`WeightLayout`) read as the ``[K][N]`` it
    holds."""
    x, w = ts
    k = te.reduce_axis((0, static_shape(x)[1]), "k")
    p = WeightLayout.of(attrs).lanes

    def weight(j):
        return w[E.floordiv(j, p), k, E.floormod(j, p)] if p else w[k, j]
    return te.compute(node.shape, lambda i, j: te.sum(x[i, k] * weight(j), axis=k), name="dense",
                      tag="dense")


register("nn.dense", "anchor", _dense_infer, _dense,
         flops=lambda node: 2 * node.size * node.inputs[0].shape[1])


def _bmm_infer(inputs, attrs):
    a, b = inputs
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise ModelError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} do not multiply")
    from .elemwise import broadcast_shape
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return (*batch, a.shape[-2], b.shape[-1]), a.dtype


def _bmm(ts, attrs, node):
    a, b = ts
    ad, bd = static_shape(a), static_shape(b)
    k = te.reduce_axis((0, ad[-1]), "k")
    nb = len(node.shape) - 2

    def pick(t, dims, idx, i, j):
        lead = len(dims) - 2
        batch = [0 if dims[q] == 1 else idx[nb - lead + q] for q in range(lead)]
        return t[tuple(batch + [i, j])]
    return te.compute(node.shape, lambda *idx: te.sum(
        pick(a, ad, idx, idx[-2], k) * pick(b, bd, idx, k, idx[-1]), axis=k),
        name="matmul", tag="matmul")


register("nn.batch_matmul", "anchor", _bmm_infer, _bmm,
         flops=lambda node: 2 * node.size * node.inputs[0].shape[-1])


# ------------------------------------------------------------------ pooling


def _pool_out(size, k, s, d, pb, pe, ceil):
    span = (k - 1) * d + 1
    if ceil:
        out = -(-(size + pb + pe - span) // s) + 1
        if (out - 1) * s >= size + pb:      # the last window must start inside the input
            out -= 1
        return out
    return (size + pb + pe - span) // s + 1


def _pool_infer(inputs, attrs):
    x = inputs[0]
    if len(x.shape) != 4:
        raise ModelError(f"pooling needs 4-D NCHW data, got {list(x.shape)}")
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh = _pool_out(x.shape[2], kh, sh, dh, pt, pb, attrs["ceil_mode"])
    ow = _pool_out(x.shape[3], kw, sw, dw, pl, pr, attrs["ceil_mode"])
    if oh <= 0 or ow <= 0:
        raise ModelError(f"pooling: output would be {oh}x{ow}")
    return (x.shape[0], x.shape[1], oh, ow), x.dtype


def _pool(ts, attrs, node):
    x = ts[0]
    _, _, h, w = static_shape(x)
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    oh, ow = node.shape[2:]
    # pad far enough for ceil_mode's last window
    eb = max(pb, (oh - 1) * sh + (kh - 1) * dh + 1 - h - pt)
    er = max(pr, (ow - 1) * sw + (kw - 1) * dw + 1 - w - pl)
    dt = x.dtype
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    if attrs["kind"] == "max":
        padded = pad_stage(x, [pt, pl], [eb, er], value=float("-inf") if E.is_float(dt) else
                           E.int_range(dt)[0])
        return te.compute(node.shape, lambda n, c, y, xx: te.max(
            padded[n, c, y * sh + ry * dh, xx * sw + rx * dw], axis=[ry, rx]),
            name="max_pool2d", tag="pool")
    padded = pad_stage(x, [pt, pl], [eb, er])
    total = te.compute(node.shape, lambda n, c, y, xx: te.sum(
        padded[n, c, y * sh + ry * dh, xx * sw + rx * dw], axis=[ry, rx]),
        name="avg_pool2d_sum", tag="pool")
    if attrs["count_include_pad"]:
        hi_h, hi_w, lo_h, lo_w = h + pb, w + pr, -pt, -pl
    else:
        hi_h, hi_w, lo_h, lo_w = h, w, 0, 0

    def count(start, k, d, lo, hi):
        """The window's taps ``start + i * d`` (``0 <= i < k``) in ``[lo, hi)``."""
        if d == 1:
            return E.minimum(start + k, hi) - E.maximum(start, lo)
        first = E.maximum(E.floordiv(lo - start + d - 1, d), 0)
        last = E.minimum(E.floordiv(hi - 1 - start, d), k - 1)
        return last - first + 1
    return te.compute(node.shape, lambda n, c, y, xx: total[n, c, y, xx] / E.cast(
        count(y * sh - pt, kh, dh, lo_h, hi_h) * count(xx * sw - pl, kw, dw, lo_w, hi_w), dt),
        name="avg_pool2d")


register("nn.pool2d", "anchor", _pool_infer, _pool,
         flops=lambda node: node.size * math.prod(node.attrs["kernel"]))


def _global_pool_infer(inputs, attrs):
    x = inputs[0]
    if len(x.shape) < 3:
        raise ModelError(f"global pooling needs N, C and spatial dimensions, got {list(x.shape)}")
    return (*x.shape[:2], *([1] * (len(x.shape) - 2))), x.dtype


def is_row_global_pool(node) -> bool:
    """A float global pooling of maps of 32 pixels or more: :func:`_global_pool` sums them in
    partial lanes."""
    return node.dtype.startswith("float") and is_long_row(node.inputs[0].shape, 2)


def _global_pool(ts, attrs, node):
    """Each map's maximum or mean; a map of 32 pixels or more in partial lanes
    (:func:`.rows.lane_reduce`; one thread, AVX-512 code: SqueezeNet's 1000 maps of 13 x 13
    50.7 -> 7.6 us, 256 maps of 56 x 56 396 -> 88, each map one serial add a pixel before)."""
    x = ts[0]
    dims = static_shape(x)
    kind = attrs["kind"]
    reducer = te.max if kind == "max" else te.sum
    if is_row_global_pool(node):
        pooled = lane_reduce(reducer, x, 2, lambda j: x[j],
                             float("-inf") if kind == "max" else 0.0, f"global_{kind}_pool")
    else:
        axes = [te.reduce_axis((0, d), f"r{k}") for k, d in enumerate(dims[2:])]
        pooled = te.compute(node.shape, lambda *i: reducer(x[(i[0], i[1], *axes)], axis=axes),
                            name="global_max_pool" if kind == "max" else "global_avg_pool_sum",
                            tag="reduce")
    if kind == "max":
        return pooled
    scale = te.const(1.0 / math.prod(dims[2:]), x.dtype)
    return te.compute(node.shape, lambda *i: pooled[i] * scale, name="global_avg_pool")


register("nn.global_pool", "anchor", _global_pool_infer, _global_pool,
         flops=lambda node: node.inputs[0].size)


# ------------------------------------------------------------------ LRN, softmax, reductions


#: LRN windows up to this many channels are written out term by term in one elementwise
#: stage; wider ones sum the window in a reduction stage of their own
LRN_WRITTEN_OUT = 16


def _lrn(ts, attrs, node):
    """``x / (bias + alpha / size * window sum of x^2) ^ beta`` over a window of channels.

    The quotient is ``x * exp(-beta * log(base))``: the vector exp and log of the generated
    code, where ``pow`` by a non-integer beta was one C library call per lane. Its relative
    error grows with ``|beta * log(base)|`` (a few ulp for the bases of trained networks,
    bias 1 and a small alpha); zero, negative, infinite and NaN bases give pow's results
    (beta 0 is the identity, as ``pow(0, 0) = 1``). A window of at most
    :data:`LRN_WRITTEN_OUT` channels is a sum of terms in the same stage, so the layer is one
    vectorized pass over the map. Inception-v1's 192 x 55 x 55 LRN, one
    thread: AVX-512 code 3.93 -> 0.78 ms, AVX2 code 3.25 -> 1.44."""
    x = ts[0]
    size, alpha, beta, bias = attrs["size"], attrs["alpha"], attrs["beta"], attrs["bias"]
    c = static_shape(x)[1]
    lo = (size - 1) // 2
    dt = x.dtype
    if beta == 0:
        return te.compute(node.shape, lambda *i: x[i], name="lrn")

    def term(idx, src):
        inside = (src >= 0) & (src < c)
        v = x[(idx[0], src, *idx[2:])]
        return E.if_then_else(inside, v * v, te.const(0, dt))

    if size <= LRN_WRITTEN_OUT:
        def window(idx):
            total = term(idx, idx[1] - lo)
            for k in range(1, size):
                total = total + term(idx, idx[1] - lo + k)
            return total
    else:
        r = te.reduce_axis((0, size), "rc")
        sq = te.compute(node.shape, lambda *i: te.sum(term(i, i[1] - lo + r), axis=r),
                        name="lrn_sqsum", tag="reduce")

        def window(idx):
            return sq[idx]
    return te.compute(node.shape, lambda *i: x[i] * te.exp(te.const(-beta, dt) * te.log(
        te.const(bias, dt) + te.const(alpha / size, dt) * window(i))), name="lrn")


register("nn.lrn", "anchor", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype), _lrn,
         flops=lambda node: node.size * (2 * node.attrs["size"] + 4))


def _softmax(ts, attrs, node):
    """Softmax along ``axis``: the row's maximum, the sum of ``exp(x - max)``, the quotient.
    Along the last axis of a long row (:func:`.rows.is_long_row`), the maximum and the sum
    are taken in partial lanes (:func:`.rows.lane_reduce`); the row's ``exp(x - max)`` is a
    stage of its own (``softmax_exp``), which the sum and the quotient read, and the quotient
    multiplies by the sum's reciprocal (one division a row, as onnxruntime's; within an ulp of
    the division). Rows of 197, one thread, AVX-512 code: 156 -> 88 us with the stage (an
    exp an element, and vector loads where the lanes' clamped index had made gathers), 76
    with the reciprocal; AVX2 code 333 -> 99."""
    x = ts[0]
    dims = static_shape(x)
    axis = attrs["axis"]
    length = dims[axis]
    red_shape = tuple(1 if k == axis else d for k, d in enumerate(dims))
    dt = x.dtype

    def at(idx, position):
        return tuple(position if k == axis else idx[k] for k in range(len(dims)))

    def keep(i):
        return tuple(0 if k == axis else i[k] for k in range(len(dims)))
    if axis == len(dims) - 1 and is_long_row(dims, axis):
        mx = lane_reduce(te.max, x, axis, lambda j: x[j], float("-inf"), "softmax_max")
        exps = te.compute(dims, lambda *i: te.exp(x[i] - mx[keep(i)]), name="softmax_exp",
                          tag="softmax_exp")
        total = lane_reduce(te.sum, x, axis, lambda j: exps[j], 0.0, "softmax_sum")
        if not attrs.get("log"):
            return te.compute(node.shape, lambda *i: exps[i] * (
                te.const(1.0, dt) / total[keep(i)]), name="softmax")
    else:
        r1 = te.reduce_axis((0, length), "r1")
        mx = te.compute(red_shape, lambda *i: te.max(x[at(i, r1)], axis=r1),
                        name="softmax_max", tag="reduce")
        ra = te.reduce_axis((0, length), "r2")
        total = te.compute(red_shape, lambda *i: te.sum(te.exp(x[at(i, ra)] - mx[i]), axis=ra),
                           name="softmax_sum", tag="reduce")
    if attrs.get("log"):
        return te.compute(node.shape, lambda *i: x[i] - mx[keep(i)] - te.log(total[keep(i)]),
                          name="log_softmax")
    return te.compute(node.shape, lambda *i: te.exp(x[i] - mx[keep(i)]) / total[keep(i)],
                      name="softmax")


register("nn.softmax", "anchor", lambda inputs, attrs: (inputs[0].shape, inputs[0].dtype),
         _softmax, flops=lambda node: 4 * node.size)


_product = te.comm_reducer(lambda x, y: x * y, lambda dtype: te.const(1, dtype), "prod")


def _reduce_infer(inputs, attrs):
    x = inputs[0]
    axes = attrs["axes"]
    if attrs["keepdims"]:
        shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
    else:
        shape = tuple(d for k, d in enumerate(x.shape) if k not in axes)
    return shape, x.dtype


#: the identity of the reductions a long row's partial lanes take (:func:`.rows.lane_reduce`)
_LANE_IDENTITY = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf")}


def is_row_reduce(node) -> bool:
    """A float sum, mean, maximum or minimum over trailing axes of long rows: the reductions
    :func:`_reduce` takes in partial lanes."""
    dims, axes = node.inputs[0].shape, tuple(sorted(node.attrs["axes"]))
    return node.attrs["kind"] in _LANE_IDENTITY and node.dtype.startswith("float") and \
        bool(axes) and axes == tuple(range(axes[0], len(dims))) and is_long_row(dims, axes[0])


def _reduce(ts, attrs, node):
    """The reduction over ``axes``; over trailing axes of long rows (:func:`is_row_reduce`) in
    partial lanes (128 rows of 256, one thread, AVX-512 code: a mean 11.4 -> 1.3 us, a maximum
    22 -> 1.3)."""
    x = ts[0]
    dims = static_shape(x)
    axes, kind, keep = attrs["axes"], attrs["kind"], attrs["keepdims"]
    reducer = {"sum": te.sum, "mean": te.sum, "max": te.max, "min": te.min,
               "prod": _product}[kind]
    scale = 1.0 / max(1, math.prod(dims[a] for a in axes))
    if is_row_reduce(node):
        first = min(axes)
        rows = lane_reduce(reducer, x, first, lambda j: x[j], _LANE_IDENTITY[kind],
                           f"reduce_{kind}")
        tail = (0,) * (len(dims) - first)

        def row(*i):
            value = rows[i] if keep else rows[tuple(i) + tail]
            return value * te.const(scale, x.dtype) if kind == "mean" else value
        return te.compute(node.shape, row, name=kind, tag="reduce_row")
    raxes = {a: te.reduce_axis((0, dims[a]), f"r{a}") for a in axes}

    def body(*idx):
        src, it = [], iter(idx)
        for k in range(len(dims)):
            if k in raxes:
                src.append(raxes[k])
                if keep:
                    next(it)
            else:
                src.append(next(it))
        return reducer(x[tuple(src)], axis=list(raxes.values()))
    out = te.compute(node.shape, body, name=f"reduce_{kind}", tag="reduce")
    if kind != "mean":
        return out
    return te.compute(node.shape, lambda *i: out[i] * te.const(scale, x.dtype), name="mean")


def _reduce_fold(xs, attrs):
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
          "prod": np.prod}[attrs["kind"]]
    return fn(xs[0], axis=tuple(attrs["axes"]), keepdims=attrs["keepdims"]).astype(xs[0].dtype)


register("reduce", "anchor", _reduce_infer, _reduce, fold=_reduce_fold,
         flops=lambda node: node.inputs[0].size)
