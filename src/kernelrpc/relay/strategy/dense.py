"""Dense layers: the weight's rows streamed into a block of outputs (``rows``), a register
tile of outputs over the whole reduction (``columns``), or, for many rows (a sequence's
tokens), a register tile of rows x outputs (``tile``, :mod:`.matmul`), by default reading the
weight in panels that ``relay.build`` lays out (:data:`DENSE_PANELS`)."""
from __future__ import annotations

from ...autotvm.space import ConfigSpace
from ...compiler.tiles import Tiles
from ..op.reference import dense_reference
from ..op.weight_layout import WeightLayout
from .common import accumulator, choices, extents, round_up
from .matmul import define_matmul_knobs, matmul_tile, schedule_matmul
from .record import Strategy


#: most outputs of a ``rows`` dense layer's block (its accumulators, in L1)
DENSE_ROWS_BLOCK = 1024
#: fewest rows for which the ``tile`` order is offered (and the default)
TILE_ROWS = 4


def define_dense_knobs(cfg, tiles: Tiles, rows: int, out_features: int, reduction: int,
                       panel: bool = True):
    """The dense layer's knobs: the order of the weight's reads (``order``), outputs per
    vector tile, the reduction unrolled by a factor, and with ``tile`` the tile's rows.

    ``"tile"`` (the default for :data:`TILE_ROWS` rows or more): ``tile_m`` rows x ``tile_n``
    outputs in registers, each weight vector read once for all the tile's rows; with
    ``weight_panel`` (the default; offered with ``panel``: a float weight) from the weight in
    panels (:func:`panels_layout`), laid out at build time where the weight is a constant,
    else a contiguous copy of the column tile's panel made in the call
    (:func:`~.matmul.schedule_matmul`).
    ``"rows"`` (the default where :func:`dense_rows_block` finds a block): a block of outputs
    accumulates in memory (L1) while the reduction streams the weight's rows, each a
    contiguous slice. ``"columns"``: a vector tile of ``tile_n`` outputs in registers over
    the whole reduction, which walks down the weight's columns (one cache line per row, rows
    apart by the row's length).
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    many = rows >= TILE_ROWS
    orders = ["rows", "columns"] if dense_rows_block(tiles, out_features) else ["columns"]
    cfg.define_knob("order", ["tile"] + orders if many else orders)
    if many:
        define_matmul_knobs(cfg, tiles, rows, out_features)
        if panel:
            cfg.define_knob("weight_panel", [True, False])
    else:
        lanes = max(tiles.lanes, 2)
        cfg.define_knob("tile_n", choices(tiles.dense_lanes, (lanes, 2 * lanes, 4 * lanes),
                                          round_up(out_features, lanes)))
    cfg.define_knob("unroll_k", [1] + [f for f in (4, 8) if reduction % f == 0])


def dense_rows_block(tiles: Tiles, out_features: int) -> tuple[int, int] | None:
    """``(outputs, lanes)`` of a ``rows`` dense layer's block: the largest divisor of the
    outputs made of whole vectors (of the target's lanes, or half as many) up to
    :data:`DENSE_ROWS_BLOCK` and, where that leaves blocks of at least 64 outputs, to a
    quarter of the outputs (blocks for several threads); None where no block has 64."""
    for lanes in (tiles.lanes, tiles.lanes // 2):
        if lanes < 2 or out_features % lanes:
            continue
        blocks = [d for d in range(lanes, min(out_features, DENSE_ROWS_BLOCK) + 1, lanes)
                  if out_features % d == 0 and d >= 64]
        if blocks:
            shared = [d for d in blocks if 4 * d <= out_features]
            return max(shared or blocks), lanes
    return None


def reads_panels(cfg) -> bool:
    """Whether a configuration reads the weight by panels (``tile`` with ``weight_panel``)."""
    return cfg["order"].val == "tile" and "weight_panel" in cfg and cfg["weight_panel"].val


def panels_layout(tiles: Tiles, node) -> WeightLayout:
    """The ``panels`` layout: panels as wide as the default tile's columns
    (:func:`~.matmul.matmul_tile`), whatever the ``tile_n`` knob says (a task's
    configurations share its arguments).

    Laid out once, not copied in every call: the copy cost a call a fixed time, a whole read
    and write of the weight (a Zen 2 core, AVX2: 64 x 256 x 1024 412 -> 330 us, onnxruntime
    363; GPT-2 10% faster; docs/performance.md)."""
    return WeightLayout.panels(matmul_tile(tiles)[1], node.shape[1])


def dense_strategy(tiles: Tiles, node, cfg=None) -> Strategy:
    """:data:`DENSE_PANELS` for a weight ``relay.build`` laid out in panels, else where the
    configuration reads panels (``cfg`` None or a space being defined: the default); else
    :data:`DENSE`."""
    if WeightLayout.of(node.attrs):
        return DENSE_PANELS
    if not DENSE_PANELS.applies(tiles, node):
        return DENSE
    if cfg is None or isinstance(cfg, ConfigSpace) or reads_panels(cfg):
        return DENSE_PANELS
    return DENSE


def dense_candidates(tiles: Tiles, node) -> list[Strategy]:
    """The strategies a dense layer's configurations choose among, the default first."""
    return [DENSE_PANELS, DENSE] if DENSE_PANELS.applies(tiles, node) else [DENSE]


def schedule_dense(s, dense, out, tiles: Tiles, cfg, node):
    if cfg["order"].val == "tile":
        laid_out = bool(WeightLayout.of(node.attrs))
        schedule_matmul(s, dense, out, tiles, cfg, node, columns_outer=True,
                        weight_panel=reads_panels(cfg) and not laid_out)
        return
    _, features = extents(s[out])
    cc = accumulator(s, dense, out)
    stage = s[out]
    m, n = stage.op.axis
    if cfg["order"].val == "rows":
        block, lanes = dense_rows_block(tiles, features)
        no, ni = stage.split(n, factor=block)
        stage.parallel(stage.fuse(m, no))
        stage.vectorize(stage.split(ni, factor=lanes)[1])
        s[cc].compute_at(stage, stage.leaf_iter_vars[0])
        _, cn = s[cc].op.axis
        (k,) = s[cc].op.reduce_axis
        cno, cni = s[cc].split(cn, factor=lanes)
        vectors = block // lanes
        unrolled = max(d for d in range(1, 11) if vectors % d == 0)
        cnoo, cnoi = s[cc].split(cno, factor=unrolled)
        s[cc].reorder(k, cnoo, cnoi, cni)
        s[cc].unroll(cnoi)
        s[cc].vectorize(cni)
        return
    no, ni = stage.split(n, factor=cfg["tile_n"].val)
    stage.reorder(m, no, ni)
    stage.vectorize(ni)
    stage.parallel(stage.fuse(m, no))
    s[cc].compute_at(stage, stage.leaf_iter_vars[0])
    _, cn = s[cc].op.axis
    (k,) = s[cc].op.reduce_axis
    if cfg["unroll_k"].val > 1:
        ko, ki = s[cc].split(k, factor=cfg["unroll_k"].val)
        s[cc].reorder(ko, ki, cn)
        s[cc].unroll(ki)
    else:
        s[cc].reorder(k, cn)
    s[cc].vectorize(cn)


def _define_knobs(cfg, tiles: Tiles, node, padded: bool):
    define_dense_knobs(cfg, tiles, node.shape[0], node.shape[1], node.inputs[0].shape[1],
                       panel=node.op == "nn.dense")


def _reference(data, weight, node):
    return dense_reference(data, weight)


#: the weight as the model has it (``[K][N]``): the ``rows`` and ``columns`` orders, and
#: ``tile`` without ``weight_panel``
DENSE = Strategy("dense", "nn.dense", applies=lambda tiles, node: True,
                 define_knobs=_define_knobs, schedule=schedule_dense, reference=_reference)
#: ``tile`` with ``weight_panel``, the weight in panels (:func:`panels_layout`)
DENSE_PANELS = Strategy("panels", "nn.dense",
                        applies=lambda tiles, node: node.shape[0] >= TILE_ROWS,
                        define_knobs=_define_knobs, schedule=schedule_dense,
                        reference=_reference, weight_layout=panels_layout)
