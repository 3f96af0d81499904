"""Reductions over long rows (softmax's last axis, the normalizations', the float reductions'
and global pooling's trailing axes): one row at a time, its partial reductions
(:data:`kernelrpc.relay.op.rows.ROW_PARTS` lanes) in vectors, the row's output in vectors, all
while the row is in cache; rows in parallel."""
from __future__ import annotations

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from ..op.nn import is_row_global_pool, is_row_reduce
from ..op.rows import is_long_row
from .record import Strategy


def long_row(tiles: Tiles, node) -> bool:
    """The operator's compute took its partial stages (a long row)."""
    return is_long_row(node.inputs[0].shape, node.attrs["axis"])


def last_long_row(tiles: Tiles, node) -> bool:
    """... along the last axis only (a softmax's)."""
    return node.attrs["axis"] == len(node.inputs[0].shape) - 1 and long_row(tiles, node)


def schedule_rows(s, anchor, out, tiles: Tiles, cfg, node):
    """One row at a time (the axes before the operator's ``axis`` fused, parallel), its
    stages inside the row's loop, its elements (the axes from ``axis`` fused) in vectors."""
    stage = s[out]
    axis = node.attrs["axis"]
    axes = list(stage.op.axis)
    row = axes[0]
    for other in axes[1:axis]:
        row = stage.fuse(row, other)
    elements = axes[axis]
    for other in axes[axis + 1:]:
        elements = stage.fuse(elements, other)
    if tiles.lanes > 1:
        stage.vectorize(stage.split(elements, factor=tiles.lanes)[1])
    stage.parallel(row)
    _rows_stages(s, stage, row, out, tiles)


def _rows_stages(s, stage, row, out, tiles: Tiles):
    """The row's partial reductions, lane reductions and kept stages inside its loop."""
    for st in s.stages:
        if not isinstance(st.op, ComputeOp) or st.op is out.op or st.attach_type != "root":
            continue
        if st.op.tag == "row_partial":
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


SOFTMAX = Strategy("rows", "nn.softmax", applies=last_long_row,
                   define_knobs=lambda *args: None,
                   schedule=schedule_rows, reference=None,
                   keeps_stage=lambda op, anchor, cfg: op.tag == "softmax_exp")
NORMALIZE = Strategy("rows", "nn.normalize", applies=long_row,
                     define_knobs=lambda *args: None, schedule=schedule_rows, reference=None)


def schedule_reduce_rows(s, anchor, out, tiles: Tiles, cfg, node):
    """A reduction's rows (its output's axes fused) in parallel, each row's partial lanes in a
    vector inside the row's loop."""
    stage = s[out]
    row = stage.op.axis[0]
    for other in stage.op.axis[1:]:
        row = stage.fuse(row, other)
    stage.parallel(row)
    _rows_stages(s, stage, row, out, tiles)


REDUCE = Strategy("rows", "reduce", applies=lambda tiles, node: is_row_reduce(node),
                  define_knobs=lambda *args: None, schedule=schedule_reduce_rows,
                  reference=None)
GLOBAL_POOL = Strategy("rows", "nn.global_pool",
                       applies=lambda tiles, node: is_row_global_pool(node),
                       define_knobs=lambda *args: None, schedule=schedule_reduce_rows,
                       reference=None)
