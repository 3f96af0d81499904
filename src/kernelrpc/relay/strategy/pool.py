"""Pooling windows (``nn.pool2d``): a vector of output columns, the window's taps outside
it, rows in parallel. At the root a pool was a scalar loop per output (its reduction kept
the columns out of vectors): ResNet-18's 3x3/2 max pool of 64 x 112 x 112 uint8 took
0.8 ms on one Emerald Rapids core where onnxruntime takes 0.13."""
from __future__ import annotations

from ...compiler.expr import dtype_bits
from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from .record import Strategy


def pool_lanes(tiles: Tiles, node) -> list[int]:
    """Vector widths of the output's columns, widest first: powers of two up to the target's
    vector of the pool's element type and the row's width; a row that a width does not divide
    ends in a shorter vector (SqueezeNet's 55, 27 and 13 columns)."""
    most = min(max(tiles.lanes, 1) * 32 // dtype_bits(node.dtype), node.shape[-1])
    return [1 << k for k in range(most.bit_length() - 1, -1, -1)]


def _define_pool_knobs(cfg, tiles: Tiles, node, padded):
    cfg.define_knob("pool_lanes", pool_lanes(tiles, node))


def schedule_pool(s, anchor, out, tiles: Tiles, cfg, node):
    """The output by vectors of columns; the window's sum or maximum (and an average's
    quotient) computed in the vector's loop, over the taps, the columns innermost."""
    stage = s[out]
    n, c, y, x = stage.op.axis
    xo, xi = stage.split(x, factor=cfg["pool_lanes"].val)
    stage.parallel(stage.fuse(stage.fuse(n, c), y))
    for st in s.stages:
        if not isinstance(st.op, ComputeOp) or st.op is out.op or st.attach_type != "root":
            continue
        st.compute_at(stage, xo)
        *_, column = st.op.axis
        _taps(st, st.op.reduce_axis, column)
        st.vectorize(column)
    if anchor.op is out.op:
        _taps(stage, anchor.op.reduce_axis, xi)
    stage.vectorize(xi)


def _taps(stage, taps, columns):
    """The window's taps outside the vector of columns, unrolled: each tap's padding test
    then folds where the tap cannot reach the padding."""
    stage.reorder(*taps, columns)
    for tap in taps:
        stage.unroll(tap)


POOL = Strategy("columns", "nn.pool2d", applies=lambda tiles, node: len(node.shape) == 4,
                define_knobs=_define_pool_knobs, schedule=schedule_pool, reference=None)
