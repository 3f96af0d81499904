"""Reductions of long rows along the last axis in partial lanes: element ``k`` of a row goes
to lane ``k % ROW_PARTS`` (a ``row_partial`` stage, which a schedule runs in vectors of that
many lanes, the whole row a loop of vector steps), then the lanes are reduced (a ``reduce``
stage). A serial sum of a row is one dependent add an element (4 cycles each on x86); the
lanes make it one vector add each ``ROW_PARTS`` elements. Softmax and LayerNormalization
use it (:mod:`.nn`, :mod:`.norm`; the schedule is :mod:`..strategy.rows`)."""
from __future__ import annotations

from ... import te
from ...compiler import expr as E
from .registry import static_shape

#: lanes of a long row's partial reductions (the schedule's vector)
ROW_PARTS = 16


def is_long_row(dims, axis: int) -> bool:
    """A reduction along the last axis of rows of at least ``2 * ROW_PARTS`` elements."""
    return axis == len(dims) - 1 and dims[axis] >= 2 * ROW_PARTS


def lane_reduce(reducer, x, value, empty: float, name: str):
    """``reducer`` (``te.sum``, ``te.max``) of ``value(index)`` over each row of ``x``'s last
    axis, through :data:`ROW_PARTS` partial lanes; ``empty`` is the reducer's identity (the
    lanes past the row's end). Returns the ``[..., 1]`` stage."""
    dims = static_shape(x)
    length, last = dims[-1], len(dims) - 1
    chunk = te.reduce_axis((0, -(-length // ROW_PARTS)), f"{name}_k")

    def term(*i):
        position = chunk * ROW_PARTS + i[last]
        # past the row's end the load is never made (masked, or a branch): no clamp needed
        return E.if_then_else(position < length, value(i[:last] + (position,)),
                              te.const(empty, x.dtype))
    parts = te.compute(tuple(dims[:last]) + (ROW_PARTS,), lambda *i: reducer(
        term(*i), axis=chunk), name=f"{name}_part", tag="row_partial")
    lane = te.reduce_axis((0, ROW_PARTS), f"{name}_lane")
    return te.compute(tuple(dims[:last]) + (1,), lambda *i: reducer(
        parts[i[:last] + (lane,)], axis=lane), name=name, tag="reduce")
