"""Depthwise convolutions: one channel's rows x columns in registers, the window unrolled."""
from __future__ import annotations

from .common import accumulator, choices, round_up, schedule_inputs
from .tiles import Tiles


def is_depthwise(node) -> bool:
    """Each output channel reads one input channel (a grouped convolution of one input
    channel per group)."""
    return node.attrs["groups"] > 1 and node.inputs[1].shape[1] == 1


def depthwise_tile(tiles: Tiles, node) -> tuple[int, int]:
    """The default ``(rows, columns)`` of a depthwise convolution's register tile: one vector
    of columns (two on 16-lane targets' maps at least 6 vectors wide: on 4-lane NEON the
    second vector's shifted loads spilled the tile, aarch64's 7 x 8 inner loop 126 FMAs in
    522 instructions with 30 stores, 7 x 4 63 in 125), 7 rows on maps of 7, 14 or 28 rows, else
    4, fewer where the accumulators and the window's weights would not fit the registers.

   
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    _, _, height, width = node.shape
    kernel_height, kernel_width = node.inputs[1].shape[2:4]
    lanes = max(tiles.lanes, 2)
    columns = 2 * lanes if width >= 6 * lanes and lanes >= 16 else lanes
    rows = 7 if height % 7 == 0 and height <= 28 else 4
    budget = tiles.registers - kernel_height * kernel_width - 2
    return max(1, min(rows, budget // (columns // lanes), height)), columns


def define_depthwise_knobs(cfg, tiles: Tiles, node, padded: bool):
    """A depthwise convolution's knobs: the output rows (``tile_y``) and columns (``tile_x``,
    whole vectors) of one channel's register tile (:func:`depthwise_tile`), and the padded
    input read in place (the default: each padded value is read by one output channel only)
    or a stage of its own."""
    _, _, out_height, out_width = node.shape
    lanes = max(tiles.lanes, 2)
    rows, columns = depthwise_tile(tiles, node)
    cfg.define_knob("tile_y", choices(rows, (1, 2, 4, 7, 8), out_height))
    cfg.define_knob("tile_x", choices(columns, (lanes // 2, lanes, 2 * lanes),
                                       round_up(out_width, lanes)))
    cfg.define_knob("pad", ["inline", "stage"] if padded else ["stage"])


def schedule_depthwise(s, conv, out, tiles: Tiles, cfg, node):
    """One channel's tile of ``tile_y`` rows x ``tile_x`` columns in registers, its window
    unrolled: the rows' and the window's loads of one input row are the same load, so an
    input vector feeds up to ``KH`` rows' FMAs, and the channel's weights stay in registers."""
    cc = accumulator(s, conv, out)
    stage = s[out]
    n, f, y, x = stage.op.axis
    yo, yi = stage.split(y, factor=cfg["tile_y"].val)
    xo, xi = stage.split(x, factor=cfg["tile_x"].val)
    stage.reorder(n, f, yo, xo, yi, xi)
    stage.parallel(stage.fuse(n, f))
    stage.unroll(yi)
    stage.vectorize(xi)
    s[cc].compute_at(stage, xo)
    _, _, cy, cx = s[cc].op.axis
    rc, ry, rx = s[cc].op.reduce_axis
    s[cc].reorder(rc, ry, rx, cy, cx)
    for axis in (ry, rx, cy):
        s[cc].unroll(axis)
    s[cc].vectorize(cx)
    schedule_inputs(s, tiles)
