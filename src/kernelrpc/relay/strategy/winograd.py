"""Winograd's F(m x m, 3 x 3) (:mod:`kernelrpc.relay.op.winograd`): which layers, the
transformed weight's size, bands of tile rows, the matrix products' register tile."""
from __future__ import annotations

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from ..op import winograd
from ..op.weight_layout import WeightLayout
from .common import extent


#: most bytes of a Winograd layer's transformed input (and of its products) for one band of
#: tile rows: the stages run band by band, each band's in cache
WINOGRAD_BAND_BYTES = 2 << 20
#: most bytes of a Winograd layer's transformed weight
WINOGRAD_WEIGHT_BYTES = 6 << 20


def winograd_plan(tiles: Tiles, node) -> tuple[int, int] | None:
    """``(m, rows)`` of a layer that runs as Winograd's F(m x m, 3 x 3) by default, else None:
    an eligible 3x3 convolution (:func:`kernelrpc.relay.op.winograd.eligible`) on a vector
    target whose output channels fill whole vectors, a band of whose tiles
    (:func:`winograd_band`) has a divisor for the matrix products' register tile (``rows``
    positions x one vector of output channels). ``m`` is 4, or 2 on maps under 8 rows or
    columns (an F(4x4) tile would be mostly padding) or where F(4x4)'s transformed weight
    would be larger than :data:`WINOGRAD_WEIGHT_BYTES`, and none where F(2x2)'s would be.

   
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    if tiles.lanes < 4 or node.op != "nn.conv2d":
        return None
    layout = WeightLayout.of(node.attrs)
    transformed = layout.kind == "winograd"              # relay.build transformed its weight
    _, out_channels, height, width = node.shape
    if not transformed and (not winograd.eligible(node) or out_channels % tiles.lanes or
                                node.inputs[0].shape[1] < 8):
        return None
    if transformed:
        sizes = [layout.m]
    else:
        in_channels = node.inputs[0].shape[1]
        sizes = [m for m in ((4, 2) if min(height, width) >= 8 else (2,))
                 if (m + 2) ** 2 * out_channels * in_channels * 4 <= WINOGRAD_WEIGHT_BYTES]
    for m in sizes:
        rows = _winograd_rows(tiles, _band_positions(m, node))
        if rows:
            return m, rows[0]
    return None


def winograd_band(m: int, node) -> int:
    """Tile rows of a band of a Winograd layer: the most that divide the map's tile rows
    with the band's transformed input (``(m+2)^2 x tiles x channels`` floats, and as many
    products) within :data:`WINOGRAD_BAND_BYTES`, at least one."""
    _, out_channels, height, width = node.shape
    th, tw = winograd.tiles(m, height, width)
    channels = max(out_channels, node.inputs[0].shape[1])
    fits = WINOGRAD_BAND_BYTES // ((m + 2) ** 2 * tw * channels * 4)
    return max(d for d in range(1, th + 1) if th % d == 0 and (d <= fits or d == 1))


def _band_positions(m: int, node) -> int:
    return winograd_band(m, node) * winograd.tiles(m, *node.shape[2:])[1]


def _winograd_rows(tiles: Tiles, positions: int) -> list[int]:
    """Register tiles of the matrix products: divisors of a band's tile count from 4 up to
    what the registers hold, largest first."""
    limit = min(14, tiles.registers - 4)
    return [d for d in range(limit, 3, -1) if positions % d == 0]


def define_winograd_knobs(cfg, tiles: Tiles, node):
    """A Winograd layer's knobs: the matrix products' register tile, ``gemm_rows`` tile
    positions x ``gemm_vectors`` vectors of output channels. The algorithm and ``m`` stay
    the default's (``layout`` has the one choice): the transformed weight's shape is ``m``'s,
    and a tuning task's weight argument is already transformed."""
    m, rows = winograd_plan(tiles, node)
    positions = _band_positions(m, node)
    cfg.define_knob("gemm_rows", [rows] + [r for r in _winograd_rows(tiles, positions)
                                           if r != rows] +
                    [r for r in (2, 3) if positions % r == 0])
    blocks = node.shape[1] // tiles.lanes
    cfg.define_knob("gemm_vectors", [1, 2] if blocks % 2 == 0 else [1])


def schedule_winograd(s, conv, out, tiles: Tiles, cfg, node):
    """The stages of :mod:`kernelrpc.relay.op.winograd` band by band of ``band`` tile rows
    (:func:`winograd_band`: the output stage's outer loop), each stage parallel inside it: the input transform per
    tile and vector of input channels (the tile and its rows' transform in registers, every
    tile position unrolled), the matrix products a register tile of ``gemm_rows`` tiles x
    ``gemm_vectors`` vectors of output channels over the input channels, and the output
    transform inside the output stage's ``m x m`` tile per vector of output channels, which
    writes the tile back as NCHW with the group's tail."""
    stages = {st.op.tag: st for st in s.stages if isinstance(st.op, ComputeOp)}
    lanes = tiles.lanes
    m = extent(stages["wino_cols"].op.axis[3])
    band = winograd_band(m, node)
    stage = s[out]
    n, f, y, x = stage.op.axis
    yb, yr = stage.split(y, factor=m * band)
    fo, fi = stage.split(f, factor=lanes)
    yo, yi = stage.split(yr, factor=m)
    xo, xi = stage.split(x, factor=m)
    stage.reorder(n, yb, fo, yo, xo, fi, yi, xi)
    stage.parallel(stage.fuse(fo, yo))
    stage.unroll(yi)
    stage.vectorize(xi)
    for tag in ("conv2d", "wino_cols"):
        inner = stages[tag]
        inner.compute_at(stage, xo)
        *_, a, b, v = inner.op.axis
        inner.unroll(a)
        inner.unroll(b)
        inner.vectorize(v)
    gemm = stages["wino_gemm"]
    gemm.compute_at(stage, yb)
    e1, e2, kb, p, kv = gemm.op.axis
    (rc,) = gemm.op.reduce_axis
    kbo, kbi = gemm.split(kb, factor=cfg["gemm_vectors"].val)
    po, pi = gemm.split(p, factor=cfg["gemm_rows"].val)
    gemm.reorder(e1, e2, kbo, po, rc, kbi, pi, kv)
    gemm.parallel(gemm.fuse(gemm.fuse(e1, e2), kbo))
    gemm.unroll(kbi)
    gemm.unroll(pi)
    gemm.vectorize(kv)
    source = stages["wino_input"]
    source.compute_at(stage, yb)
    e1, e2, p, c = source.op.axis
    co, ci = source.split(c, factor=lanes)
    source.reorder(p, co, e1, e2, ci)
    source.parallel(p)
    for axis in (e1, e2):
        source.unroll(axis)
    source.vectorize(ci)
    for tag in ("wino_rows", "wino_tile"):
        inner = stages[tag]
        inner.compute_at(source, co)
        _, i, j, c = inner.op.axis
        inner.unroll(i)
        inner.unroll(j)
        inner.vectorize(c)
