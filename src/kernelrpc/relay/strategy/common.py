"""What the strategies' schedules share: knob choices, the parallel outer loop, the
accumulator stage, the padded input's stage."""
from __future__ import annotations

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles


def extent(axis) -> int:
    return int(getattr(axis.extent, "value", axis.extent))


def extents(stage):
    return [extent(iv) for iv in stage.op.axis]


def parallel_outer(s, stage, lanes: int = 1, kept: int = 1):
    """Parallel over the leading axes (fused while they are short, never the last ``kept``
    of them); with ``lanes`` > 1 the last axis in vectors of that many lanes (a stage without
    a reduction of its own)."""
    axes = list(stage.op.axis)
    if not axes:
        return
    sizes = extents(stage)
    if lanes > 1 and sizes[-1] >= lanes and not stage.op.reduce_axis:
        last, inner = stage.split(axes[-1], factor=lanes)
        stage.vectorize(inner)
        axes[-1], sizes[-1] = last, -(-sizes[-1] // lanes)
    outer, size, k = axes[0], sizes[0], 1
    while size < 16 and k < len(axes) - kept:
        outer = stage.fuse(outer, axes[k])
        size *= sizes[k]
        k += 1
    if size > 1:
        stage.parallel(outer)


def accumulator(s, anchor, out):
    """The stage that accumulates the anchor's reduction in the output's tile: the anchor itself
    when an elementwise tail is the output, else a cache of the output (``cache_write``)."""
    return s.cache_write(out, "global") if anchor.op is out.op else anchor


def choices(default: int, candidates, limit: int) -> list[int]:
    """``default`` first, then the candidates up to ``limit``, each once."""
    out = [default]
    out += [c for c in candidates if c <= limit and c not in out]
    return out


def divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit``."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def output_tiles(stage, channels: int, rows: int, cols: int, rows_outer: bool = False):
    """An NCHW output stage by tiles of ``channels`` (a vector layout's blocks, a group's
    channels) x ``rows`` x ``cols``, parallel over the batch, the channel tiles and the row
    tiles (the row tiles outside with ``rows_outer``: each core's share a band of rows of
    every channel), the columns in a vector; returns the loop inside which a tile's
    accumulation is computed."""
    n, f, y, x = stage.op.axis
    fo, fi = stage.split(f, factor=channels)
    yo, yi = stage.split(y, factor=rows)
    xo, xi = stage.split(x, factor=cols)
    outer = (yo, fo) if rows_outer else (fo, yo)
    stage.reorder(n, *outer, xo, fi, yi, xi)
    stage.parallel(stage.fuse(stage.fuse(n, outer[0]), outer[1]))
    stage.unroll(yi)
    if cols > 1:
        stage.vectorize(xi)
    return xo


def accumulate_tile(s, blocked, cfg, blocks_in_tile: bool):
    """The register tile of a ``[n][B][h][w][V]`` stage accumulated over its reduction: the
    ``reduce_order`` knob's loop order, the window's columns unrolled by ``unroll_kw``, the
    tile's rows and columns unrolled, its lanes a vector; its vectors of channels unrolled
    inside the tile (``blocks_in_tile``, the ``channels`` layout) or one after another around
    it (the ``grouped`` layout)."""
    _, cb, cy, cx, cv = s[blocked].op.axis
    rc, ry, rx = s[blocked].op.reduce_axis
    window = (rc, ry, rx) if cfg["reduce_order"].val == "channels_outer" else (ry, rx, rc)
    if blocks_in_tile:
        s[blocked].reorder(*window, cb, cy, cx, cv)
    else:
        s[blocked].reorder(cb, *window, cy, cx, cv)
    if cfg["unroll_kw"].val:
        s[blocked].unroll(rx)
    for axis in (cb, cy, cx) if blocks_in_tile else (cy, cx):
        s[blocked].unroll(axis)
    s[blocked].vectorize(cv)


def schedule_inputs(s, tiles: Tiles, by_rows: bool = False):
    """The padded input at the root: parallel, vectorized; with ``by_rows`` parallel over its
    rows, each row's channels (and phases) inside, so that each core writes the rows its own
    share of the output reads, where the output is split by rows (else the padded input is
    split by channels and each core reads half of its rows from the other core's cache)."""
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and st.op.tag == "pad" and \
                st.attach_type == "root":
            axes = list(st.op.axis)
            if by_rows and len(axes) >= 4:
                st.reorder(axes[0], axes[-2], *axes[1:-2], axes[-1])
                st.parallel(st.fuse(axes[0], axes[-2]))
            else:
                parallel_outer(s, st)
            inner = axes[-1]
            if extents(st)[-1] >= tiles.lanes > 1:
                st.vectorize(st.split(inner, factor=tiles.lanes)[1])
