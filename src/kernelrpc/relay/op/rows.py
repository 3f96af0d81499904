"""Reductions of long rows (each index's trailing axes from one on: one contiguous run) in
partial lanes: element ``k`` of a row goes to lane ``k % ROW_PARTS`` (a ``row_partial``
stage, which a schedule runs in vectors of that many lanes, the whole row a loop of vector
steps), then the lanes are reduced (a ``reduce`` stage). A serial sum of a row is one
dependent add an element (4 cycles each on x86); the lanes make it one vector add each
``ROW_PARTS`` elements. Softmax, the normalizations, the float reductions over trailing axes
and global pooling use it (:mod:`.nn`, :mod:`.norm`; the schedule is
:mod:`..strategy.rows`)."""
from __future__ import annotations

import math

from ... import te
from ...compiler import expr as E
from .registry import static_shape, unravel

#: lanes of a long row's partial reductions (the schedule's vector)
ROW_PARTS = 16


def is_long_row(dims, axis: int) -> bool:
    """A reduction over the trailing axes from ``axis`` (one contiguous row of each index
    before it, at least one axis before it) of at least ``2 * ROW_PARTS`` elements."""
    return 1 <= axis < len(dims) and math.prod(dims[axis:]) >= 2 * ROW_PARTS


def lane_reduce(reducer, x, axis: int, value, empty: float, name: str):
    """``reducer`` (``te.sum``, ``te.max``) of ``value(index)`` over each row of ``x`` (its
    axes from ``axis`` on, flattened), through :data:`ROW_PARTS` partial lanes; ``empty`` is
    the reducer's identity (the lanes past the row's end). Returns the stage of the row's
    result, ``x``'s shape with 1 for each reduced axis."""
    dims = static_shape(x)
    length = math.prod(dims[axis:])
    chunk = te.reduce_axis((0, -(-length // ROW_PARTS)), f"{name}_k")

    def term(*i):
        position = chunk * ROW_PARTS + i[axis]
        # past the row's end the load is never made (masked, or a branch): no clamp needed
        return E.if_then_else(position < length,
                              value((*i[:axis], *unravel(position, dims[axis:]))),
                              te.const(empty, x.dtype))
    parts = te.compute(tuple(dims[:axis]) + (ROW_PARTS,), lambda *i: reducer(
        term(*i), axis=chunk), name=f"{name}_part", tag="row_partial")
    lane = te.reduce_axis((0, ROW_PARTS), f"{name}_lane")
    return te.compute(tuple(dims[:axis]) + (1,) * (len(dims) - axis), lambda *i: reducer(
        parts[i[:axis] + (lane,)], axis=lane), name=name, tag="reduce")
