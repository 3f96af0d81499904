"""Strategies: for each tunable operator class, its implementations as records
(:class:`Strategy`) and the one rule that picks the default.

A new kernel family (int8, batched matmul...) is a new record in its class's table, and
its class's rule says when it is the default. Target facts come from :func:`tiles_for`
(the target's vector unit). Below :mod:`kernelrpc.relay.build_module` and
:mod:`kernelrpc.relay.tuning`, above the operators (:mod:`kernelrpc.relay.op`).
"""
from __future__ import annotations

from ...compiler.tiles import Tiles, tiles_for
from .. import ir
from ..errors import ModelError
from .channels import channel_tiles, channels_default
from .conv2d import CONV2D, DEPTHWISE, DIRECT, CHANNELS, GROUPED, PIXELS, WINOGRAD, \
    candidates, conv2d_strategy, define_conv_knobs
from .dense import DENSE, DENSE_PANELS, DENSE_ROWS_BLOCK, define_dense_knobs, dense_candidates, \
    dense_rows_block, dense_strategy
from .depthwise import depthwise_pad, depthwise_tile, is_depthwise
from .grouped import group_tiles
from .int8 import INT8
from .matmul import BATCH_MATMUL, matmul_tile
from .pool import POOL
from .record import Strategy, as_modelled
from .rows import GLOBAL_POOL, NORMALIZE, REDUCE, SOFTMAX
from .winograd import WINOGRAD_BAND_BYTES, WINOGRAD_WEIGHT_BYTES, winograd_band, winograd_plan


#: each tunable operator's implementations
STRATEGIES = {"nn.conv2d": CONV2D, "nn.dense": (DENSE_PANELS, DENSE),
              "nn.batch_matmul": (BATCH_MATMUL,),
              "nn.softmax": (SOFTMAX,), "nn.normalize": (NORMALIZE,), "reduce": (REDUCE,),
              "nn.global_pool": (GLOBAL_POOL,), "nn.pool2d": (POOL,), **INT8}


def strategy_for(tiles: Tiles, node: ir.Node, cfg=None) -> Strategy:
    """The implementation of a tunable layer (see :func:`conv2d_strategy`); of another
    operator, the record its ``strategy`` attribute names (a tuning task's integer layer,
    whose choice depended on its constant weight: :func:`kernelrpc.relay.tuning.workload`),
    else the first record of its table that applies."""
    if node.op == "nn.conv2d":
        return conv2d_strategy(tiles, node, cfg)
    if node.op == "nn.dense":
        return dense_strategy(tiles, node, cfg)
    named = node.attrs.get("strategy")
    if named is not None:
        found = [s for s in STRATEGIES[node.op] if s.name == named]
        if not found:
            raise ModelError(f"{node.op}: no strategy {named!r} (the table has "
                             f"{', '.join(s.name for s in STRATEGIES[node.op])})")
        return found[0]
    return next(s for s in STRATEGIES[node.op] if s.applies(tiles, node))


def layout_candidates(tiles: Tiles, node: ir.Node) -> list[Strategy]:
    """The strategies a layer's configurations choose among, the default first (a
    convolution's and a dense layer's may read their weight in different layouts)."""
    if node.op == "nn.conv2d":
        return candidates(tiles, node)
    if node.op == "nn.dense":
        return dense_candidates(tiles, node)
    return [strategy_for(tiles, node)]


def has_strategy(tiles: Tiles, node: ir.Node | None) -> bool:
    """Whether a group's anchor is scheduled by a strategy (else at the root)."""
    if node is not None and node.op == "nn.conv2d":
        node = as_modelled(node)
    return node is not None and node.op in STRATEGIES and (
        "strategy" in node.attrs or any(s.applies(tiles, node) for s in STRATEGIES[node.op]))


def define_knobs(cfg, tiles: Tiles, node: ir.Node, padded: bool):
    """The knobs of a tunable layer's space."""
    if node.op == "nn.conv2d":
        define_conv_knobs(cfg, tiles, node, padded)
    else:
        strategy_for(tiles, node).define_knobs(cfg, tiles, node, padded)


__all__ = ["BATCH_MATMUL", "CHANNELS", "CONV2D", "DENSE", "DENSE_PANELS", "DENSE_ROWS_BLOCK",
           "DEPTHWISE", "DIRECT", "GROUPED", "PIXELS", "POOL", "SOFTMAX", "STRATEGIES",
           "Strategy", "Tiles", "WINOGRAD", "WINOGRAD_BAND_BYTES", "WINOGRAD_WEIGHT_BYTES",
           "as_modelled", "candidates", "channel_tiles", "channels_default", "conv2d_strategy",
           "define_conv_knobs", "define_dense_knobs", "define_knobs", "dense_rows_block",
           "depthwise_pad", "depthwise_tile", "group_tiles", "has_strategy", "is_depthwise",
           "layout_candidates", "matmul_tile", "strategy_for", "tiles_for", "winograd_band",
           "winograd_plan"]
