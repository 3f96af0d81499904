"""Softmax along the last axis of long rows: one row at a time, its partial maxima and sums
(:data:`kernelrpc.relay.op.nn.SOFTMAX_PARTS` lanes) in vectors, the quotient in vectors, all
while the row is in cache; rows in parallel."""
from __future__ import annotations

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from ..op.nn import SOFTMAX_PARTS
from .record import Strategy


def row_softmax(tiles: Tiles, node) -> bool:
    """The operator's compute took its partial stages (a long row along the last axis)."""
    axis, dims = node.attrs["axis"], node.inputs[0].shape
    return axis == len(dims) - 1 and dims[axis] >= 2 * SOFTMAX_PARTS


def schedule_softmax(s, softmax, out, tiles: Tiles, cfg, node):
    stage = s[out]
    *lead, last = stage.op.axis
    row = lead[0]
    for axis in lead[1:]:
        row = stage.fuse(row, axis)
    if tiles.lanes > 1:
        stage.vectorize(stage.split(last, factor=tiles.lanes)[1])
    stage.parallel(row)
    for st in s.stages:
        if not isinstance(st.op, ComputeOp) or st.op is out.op or st.attach_type != "root":
            continue
        if st.op.tag == "softmax_partial":
            st.compute_at(stage, row)
            *_, lane = st.op.axis
            st.reorder(*st.op.reduce_axis, lane)
            if tiles.lanes > 1:
                st.vectorize(lane)
        elif st.op.tag == "softmax_exp":
            st.compute_at(stage, row)
            if tiles.lanes > 1:
                st.vectorize(st.split(st.op.axis[-1], factor=tiles.lanes)[1])
        elif st.op.reduce_axis:
            st.compute_at(stage, row)


SOFTMAX = Strategy("rows", "nn.softmax", applies=row_softmax, define_knobs=lambda *args: None,
                   schedule=schedule_softmax, reference=None,
                   keeps_stage=lambda op, anchor, cfg: op.tag == "softmax_exp")
