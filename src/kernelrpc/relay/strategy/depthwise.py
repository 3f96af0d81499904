"""Depthwise convolutions: one channel's rows x columns in registers, the window unrolled."""
from __future__ import annotations

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from .common import accumulator, choices, round_up, schedule_inputs

#: where the padded input is: read in place through its bounds checks, one channel's plane
#: staged inside the channel's loop, a stage of its own at the root, or the rows one band of
#: output rows reads staged inside the band's loop (a channel's plane of 112 x 112 floats
#: is past a core's L1; the band's stays in it)
PAD_PLACES = ("inline", "channel", "stage", "band")


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


def depthwise_pad(tiles: Tiles, node) -> str:
    """Where the default schedule puts the padded input (:data:`PAD_PLACES`): in place, the
    padded reads' selects left to the tiles at the map's edges (loop partitioning,
    :mod:`~kernelrpc.compiler.lower.partition`); but one channel's phases staged in its loop
    for a strided layer from 28 pixels or fewer on targets under 16 lanes, whose few tiles
    a row the partitioning leaves with the selects. One thread, MobileNet-v2's layers, us, in
    place / in the channel's loop, AVX2 code: stride 1 on 112, 56, 28 171/203, 157/191,
    61/72; stride 2 from 112, 56, 28, 14 268/319, 102/101, 56/54, 39/31; SSE code
    (``-mcpu=x86-64``): stride 1 on 112, 56 340/347, 315/350; stride 2 from 28, 14 111/60,
    78/45. (Before the partitioning AVX2 code staged stride-1 layers of 56 pixels or more: a
    mask computed and a ``vmaskmovps`` per load in place.) AVX-512 code keeps its input in
    place (its masked loads take a mask register and cost nothing more; not measured since
    the partitioning)."""
    width = node.inputs[0].shape[3]
    strided = tuple(node.attrs["strides"]) != (1, 1)
    return "channel" if strided and width <= 28 and 1 < tiles.lanes < 16 else "inline"


def define_depthwise_knobs(cfg, tiles: Tiles, node, padded: bool, pad: str | None = None,
                           places: tuple[str, ...] = PAD_PLACES):
    """A depthwise convolution's knobs: the output rows (``tile_y``) and columns (``tile_x``,
    whole vectors) of one channel's register tile (:func:`depthwise_tile`), and where the
    padded input is (``pad``, one of ``places``: ``pad`` first, else :func:`depthwise_pad`'s
    default)."""
    _, _, out_height, out_width = node.shape
    lanes = max(tiles.lanes, 2)
    rows, columns = depthwise_tile(tiles, node)
    cfg.define_knob("tile_y", choices(rows, (1, 2, 4, 7, 8), out_height))
    cfg.define_knob("tile_x", choices(columns, (lanes // 2, lanes, 2 * lanes),
                                       round_up(out_width, lanes)))
    default = pad or depthwise_pad(tiles, node)
    cfg.define_knob("pad", [default, *(p for p in places if p != default)] if padded
                    else ["stage"])


def keeps_padded_input(op, anchor, cfg) -> bool:
    """The padded input is a stage (in the channel's loop or at the root) unless the ``pad``
    knob reads it in place."""
    return op.tag == "pad" and cfg["pad"].val != "inline"


def schedule_depthwise(s, conv, out, tiles: Tiles, cfg, node):
    """One channel's tile of ``tile_y`` rows x ``tile_x`` columns in registers, its window
    unrolled: the rows' and the window's loads of one input row are the same load, so an
    input vector feeds up to ``KH`` rows' FMAs, and the channel's weights stay in registers.
    With ``pad`` ``channel`` the channel's padded plane is computed in the channel's loop
    (in cache when its rows are read) and the tile's loads have no bounds checks; with
    ``band`` the rows of one band of ``tile_y`` output rows, in the band's loop."""
    cc = accumulator(s, conv, out)
    stage = s[out]
    n, f, y, x = stage.op.axis
    yo, yi = stage.split(y, factor=cfg["tile_y"].val)
    xo, xi = stage.split(x, factor=cfg["tile_x"].val)
    stage.reorder(n, f, yo, xo, yi, xi)
    channel = stage.fuse(n, f)
    stage.parallel(channel)
    stage.unroll(yi)
    stage.vectorize(xi)
    s[cc].compute_at(stage, xo)
    _, _, cy, cx = s[cc].op.axis
    rc, ry, rx = s[cc].op.reduce_axis
    s[cc].reorder(rc, ry, rx, cy, cx)
    for axis in (ry, rx, cy):
        s[cc].unroll(axis)
    s[cc].vectorize(cx)
    if cfg["pad"].val in ("channel", "band"):
        _stage_inside(s, stage, channel if cfg["pad"].val == "channel" else yo, tiles)
    schedule_inputs(s, tiles)


def _stage_inside(s, stage, loop, tiles: Tiles):
    """The padded input computed inside ``loop`` (the part of a channel's plane it reads), its
    rows in vectors."""
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and st.op.tag == "pad":
            st.compute_at(stage, loop)
            if tiles.lanes > 1:
                st.vectorize(st.split(st.op.axis[-1], factor=tiles.lanes)[1])
