"""Winograd's minimal filtering for 3x3 convolutions, F(m x m, 3 x 3) (Lavin & Gray, 2016).

An output tile of ``m x m`` comes from an ``a x a`` input tile (``a = m + 2``) as
``Y = A^T [ U * (B^T d B) ] A``: the input tile transformed (``B^T d B``), multiplied
elementwise by the transformed weight ``U = G g G^T`` and summed over the input channels (one
matrix product per position of the ``a x a`` tile), and transformed back (``A^T . A``). A
layer of F(4x4, 3x3) does 36 multiply-adds per input channel for 16 outputs where the direct
convolution does 144. ``relay.build`` transforms the weight once (:func:`transform_weight`); the
kernel runs the rest:

- ``wino_tile[p, i, j, c]``: the padded input's ``a x a`` tile ``p`` (tiles in row-major order);
- ``wino_rows``, ``wino_input[e1, e2, p, c]``: ``B^T d B``, one side at a time;
- ``wino_gemm[e1, e2, kb, p, kv]``: ``sum_c U[e1, e2, kb, c, kv] * V[e1, e2, p, c]``, the
  output channels ``kb * V + kv`` blocked by the vector width ``V``;
- ``wino_cols``, ``conv2d_blocked[n, kb, y, x, kv]``: ``A^T M A``, one side at a time, read
  back as NCHW by the group's output stage (as the ``channels`` layout's ``conv2d_blocked``).

The transforms are sums with the matrices' constant coefficients written out (zero terms
left out), chosen per tile position by a select on the position's index; the schedule unrolls
those positions, so each select folds to its one sum.
"""
from __future__ import annotations

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .registry import static_shape

#: B^T, G and A^T of F(m, 3) for each supported m: Lavin & Gray's points (0, +-1, +-2, inf)
MATRICES = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
         [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
         [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}

def eligible(node) -> bool:
    """A float32 3x3 convolution of stride 1, dilation 1, one group and no negative padding."""
    attrs, weight = node.attrs, node.inputs[1]
    return (len(weight.shape) == 4 and tuple(weight.shape[2:]) == (3, 3)
            and attrs["groups"] == 1 and tuple(attrs["strides"]) == (1, 1)
            and tuple(attrs["dilation"]) == (1, 1)
            and tuple(attrs.get("upsample", (1, 1))) == (1, 1)
            and min(attrs["padding"]) >= 0 and weight.dtype == "float32")


def tiles(m: int, out_height: int, out_width: int) -> tuple[int, int]:
    """Output tiles down and across."""
    return -(-out_height // m), -(-out_width // m)


def transform_weight(weight: np.ndarray, m: int, lanes: int) -> np.ndarray:
    """An OIHW 3x3 weight as ``U = G g G^T``, laid out ``[a][a][O/V][I][V]`` (float64 inside)."""
    _, g, _ = (np.array(x, dtype=np.float64) for x in MATRICES[m])
    out_channels, in_channels = weight.shape[:2]
    u = np.einsum("ai,kcij,bj->abkc", g, weight.astype(np.float64), g)
    a = m + 2
    u = u.reshape(a, a, out_channels // lanes, lanes, in_channels).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(u.astype(weight.dtype))


def _combination(rows, index, term):
    """``sum_k rows[index][k] * term(k)`` for a symbolic ``index``: a select over its values
    of sums written out with the constant coefficients (zero terms left out)."""
    expr = None
    for r in reversed(range(len(rows))):
        leaf = None
        for k, c in enumerate(rows[r]):
            if c == 0:
                continue
            t = term(k)
            t = t if c == 1 else -t if c == -1 else t * float(c)
            leaf = t if leaf is None else leaf + t
        expr = leaf if expr is None else E.if_then_else(index == r, leaf, expr)
    return expr


def conv2d(padded_input, u, node, m: int, lanes: int):
    """The layer's NCHW output from its input (``padded_input(before, after)`` the input padded
    by those rows and columns) and its transformed weight ``u`` (:func:`transform_weight`)."""
    if len(static_shape(u)) != 5:
        raise ModelError(f"conv2d: a Winograd F({m}x{m}) layer needs the transformed weight "
                         f"[a][a][O/V][I][V], got shape {static_shape(u)}")
    n, in_channels, height, width = static_shape(node.inputs[0])
    _, out_channels, out_height, out_width = node.shape
    if out_channels % lanes:
        raise ModelError(f"conv2d: a Winograd layer of {lanes} lanes needs output channels "
                         f"a multiple of {lanes}, got {out_channels}")
    bt, _, at = MATRICES[m]
    a = m + 2
    th, tw = tiles(m, out_height, out_width)
    pt, pl = node.attrs["padding"][:2]
    padded = padded_input([pt, pl], [th * m + 2 - height - pt, tw * m + 2 - width - pl])
    per_image = th * tw

    def tile_origin(p):
        return E.floordiv(p, per_image), E.floordiv(E.floormod(p, per_image), tw) * m, \
            E.floormod(p, tw) * m

    def tile_of(b, y, x):
        return b * per_image + E.floordiv(y, m) * tw + E.floordiv(x, m)

    def window(p, i, j, c):
        b, y, x = tile_origin(p)
        return padded[b, c, y + i, x + j]
    tile = te.compute((n * per_image, a, a, in_channels), window, name="wino_tile",
                      tag="wino_tile")
    rows = te.compute((n * per_image, a, a, in_channels), lambda p, i, e2, c: _combination(
        bt, e2, lambda j: tile[p, i, j, c]), name="wino_rows", tag="wino_rows")
    v = te.compute((a, a, n * per_image, in_channels), lambda e1, e2, p, c: _combination(
        bt, e1, lambda i: rows[p, i, e2, c]), name="wino_input", tag="wino_input")
    rc = te.reduce_axis((0, in_channels), "rc")
    gemm = te.compute((a, a, out_channels // lanes, n * per_image, lanes),
                      lambda e1, e2, kb, p, kv: te.sum(u[e1, e2, kb, rc, kv] * v[e1, e2, p, rc],
                                                       axis=[rc]),
                      name="wino_gemm", tag="wino_gemm")
    cols = te.compute((out_channels // lanes, n * per_image, a, m, lanes),
                      lambda kb, p, e1, xi, kv: _combination(
                          at, xi, lambda e2: gemm[e1, e2, kb, p, kv]),
                      name="wino_cols", tag="wino_cols")
    blocked = te.compute((n, out_channels // lanes, out_height, out_width, lanes),
                         lambda b, kb, y, x, kv: _combination(
                             at, E.floormod(y, m),
                             lambda e1: cols[kb, tile_of(b, y, x), e1, E.floormod(x, m), kv]),
                         name="conv2d_blocked", tag="conv2d")
    return te.compute(node.shape, lambda b, o, y, x: blocked[
        b, E.floordiv(o, lanes), y, x, E.floormod(o, lanes)], name="conv2d", tag="conv2d_unblock")


def reference(data, u, *, m: int, padding, out_shape):
    """numpy's F(m, 3) convolution of ``data`` with a transformed weight ``u`` (float64): the
    check of a tuning candidate, whose weight argument is already transformed."""
    bt, _, at = (np.array(x, dtype=np.float64) for x in MATRICES[m])
    n, _, height, width = data.shape
    _, _, out_height, out_width = out_shape
    th, tw = tiles(m, out_height, out_width)
    pt, pl = padding[:2]
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (pt, th * m + 2 - height - pt),
                                              (pl, tw * m + 2 - width - pl)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (m + 2, m + 2), axis=(2, 3))
    windows = windows[:, :, ::m, ::m][:, :, :th, :tw]               # n, c, th, tw, a, a
    v = np.einsum("ei,nctwij,fj->efnctw", bt, windows, bt)
    uk = u.astype(np.float64).transpose(0, 1, 2, 4, 3).reshape(m + 2, m + 2, -1, u.shape[3])
    mm = np.einsum("efkc,efnctw->efnktw", uk, v)
    y = np.einsum("ye,efnktw,xf->nktywx", at, mm, at)
    y = y.reshape(n, -1, th * m, tw * m)[:, :, :out_height, :out_width]
    return y.astype(data.dtype)
