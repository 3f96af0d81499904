"""Matrix products with many rows (attention's batched MatMul, a dense layer over a sequence):
a register tile of ``tile_m`` rows x ``tile_n`` columns (whole vectors) accumulates over the
whole reduction, each step one broadcast of the left operand per row and one vector load of
the right operand's row per column vector, the group's tail applied to the tile in registers.
"""
from __future__ import annotations

import numpy as np

from ...compiler.tiles import Tiles
from .common import accumulator, choices, round_up
from .record import Strategy


def matmul_tile(tiles: Tiles) -> tuple[int, int]:
    """The default ``(rows, columns)``: two vectors of columns and as many rows as leave four
    registers for the operands, at most 8 (AVX-512 8 x 32, AVX2 6 x 16, NEON 8 x 8 on aarch64,
    6 x 8 on armv7, scalar 4 x 4)."""
    if tiles.lanes == 1:
        return 4, 4
    return min(8, (tiles.registers - 4) // 2), 2 * tiles.lanes


def define_matmul_knobs(cfg, tiles: Tiles, rows: int, columns: int, tile=None):
    """``tile_m`` rows and ``tile_n`` columns of the register tile, ``tile`` (default
    :func:`matmul_tile`) the default."""
    lanes = max(tiles.lanes, 2)
    mr, nr = tile or matmul_tile(tiles)
    cfg.define_knob("tile_m", choices(min(mr, rows), (1, 2, 4, 6, 8), rows))
    cfg.define_knob("tile_n", choices(nr, (lanes, 2 * lanes, 3 * lanes, 4 * lanes),
                                      round_up(columns, lanes)))


def schedule_matmul(s, product, out, tiles: Tiles, cfg, node, columns_outer: bool = False,
                    weight_panel: bool = False):
    """The tile over the last two axes of the output, parallel over the batch and the outer
    tiles: the row tiles, or with ``columns_outer`` (a dense layer's weight) the column
    tiles, so that a block of the weight stays in cache while every row tile reads it. With
    ``weight_panel`` (and ``columns_outer``) each column tile first copies its panel of the
    weight (the whole reduction x ``tile_n`` columns) into a buffer of its own, contiguous,
    which every row tile then reads: in the weight the panel's rows lie a whole row apart,
    and rows of a power of two of 4 KB or more fall in a few cache sets (BERT's 256 -> 1024
    layer on a Zen 2 core, whose L1 and L2 are 8-way: 60 -> 92 GFLOP/s; docs/performance.md)."""
    panel = s.cache_read(product.op.input_tensors[1], "global", [product]) if weight_panel \
        else None
    cc = accumulator(s, product, out)
    stage = s[out]
    *batch, i, j = stage.op.axis
    io, ii = stage.split(i, factor=cfg["tile_m"].val)
    jo, ji = stage.split(j, factor=cfg["tile_n"].val)
    outer, inner = (jo, io) if columns_outer else (io, jo)
    stage.reorder(*batch, outer, inner, ii, ji)
    stage.unroll(ii)
    stage.vectorize(ji)
    s[cc].compute_at(stage, inner)
    for axis in reversed(batch):
        outer = stage.fuse(axis, outer)
    stage.parallel(outer)
    if panel is not None:
        s[panel].compute_at(stage, outer)
        s[panel].vectorize(s[panel].op.axis[-1])
    *_, ci, cj = s[cc].op.axis
    (k,) = s[cc].op.reduce_axis
    s[cc].reorder(k, ci, cj)
    s[cc].unroll(ci)
    s[cc].vectorize(cj)


def _batch_matmul_reference(a, b, node):
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


BATCH_MATMUL = Strategy(
    "tile", "nn.batch_matmul", applies=lambda tiles, node: node.dtype == "float32",
    define_knobs=lambda cfg, tiles, node, padded: define_matmul_knobs(
        cfg, tiles, node.shape[-2], node.shape[-1]),
    schedule=schedule_matmul, reference=_batch_matmul_reference)
