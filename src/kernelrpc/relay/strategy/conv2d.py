"""The convolution's strategy table, and the one rule that picks its default.

``direct`` (columns in the vector), ``channels`` (output channels in the vector, packed
weight), ``grouped`` (a grouped convolution's channels by group, padded to whole vectors),
``winograd`` (F(m x m, 3 x 3), transformed weight), ``pixels`` (a pointwise convolution as a
matrix product over the flattened pixels) and ``depthwise`` (one channel's rows x columns). :func:`candidates` is the default's rule; the ``layout`` knob chooses among
the candidates, default first; once ``relay.build`` has put a layer's weight in a strategy's
layout, the layout names the strategy.
"""
from __future__ import annotations

from ...compiler.tiles import Tiles
from ...autotvm.space import ConfigSpace
from .. import ir
from ..op import winograd as winograd_op
from ..op.reference import conv2d_reference
from ..op.weight_layout import WeightLayout
from .channels import channel_tiles, channels_default, schedule_channels
from .depthwise import define_depthwise_knobs, is_depthwise, keeps_padded_input, \
    schedule_depthwise
from .direct import define_direct_knobs, schedule_direct
from .grouped import define_grouped_knobs, group_tiles, grouped_default, grouped_layout, \
    schedule_grouped
from .pointwise import define_pixels_knobs, is_pointwise, keeps_input_stage, pixels_default, \
    pixels_layout, schedule_pixels
from .record import Strategy, as_modelled
from .winograd import define_winograd_knobs, schedule_winograd, winograd_plan


#: how far a Winograd candidate's outputs may be from numpy's, of their largest magnitude
#: (F(4x4)'s rounding: up to 2e-5 measured on 512 input channels)
WINOGRAD_ATOL = 1e-4


def _conv_reference(data, weight, node):
    return conv2d_reference(data, weight, **{k: node.attrs[k] for k in
                                             ("strides", "padding", "dilation", "groups")})


def _winograd_reference(data, weight, node):
    """numpy's Winograd with the transformed weight (``[a][a][O/V][I][V]``, ``a = m + 2``)."""
    return winograd_op.reference(data, weight, m=weight.shape[0] - 2,
                                 padding=node.attrs["padding"], out_shape=node.shape)


DIRECT = Strategy(
    "columns", "nn.conv2d", applies=lambda tiles, node: not is_depthwise(node),
    define_knobs=lambda cfg, tiles, node, padded: define_direct_knobs(
        cfg, tiles, node, padded, unrolled_row=_unrolls_row(tiles, node)),
    schedule=schedule_direct, reference=_conv_reference)
CHANNELS = Strategy(
    "channels", "nn.conv2d", applies=lambda tiles, node: bool(channel_tiles(tiles, node)),
    define_knobs=lambda cfg, tiles, node, padded: cfg.define_knob(
        "channel_tile", channel_tiles(tiles, node)),
    schedule=schedule_channels, reference=_conv_reference,
    weight_layout=lambda tiles, node: WeightLayout.packed(tiles.lanes))
WINOGRAD = Strategy(
    "winograd", "nn.conv2d", applies=lambda tiles, node: winograd_plan(tiles, node) is not None,
    define_knobs=lambda cfg, tiles, node, padded: define_winograd_knobs(cfg, tiles, node),
    schedule=schedule_winograd, reference=_winograd_reference,
    weight_layout=lambda tiles, node: WeightLayout.winograd(winograd_plan(tiles, node)[0],
                                                           tiles.lanes),
    keeps_stage=lambda op, anchor, cfg: op.tag.startswith("wino_") or op is anchor.op,
    scale_atol=WINOGRAD_ATOL)
GROUPED = Strategy(
    "grouped", "nn.conv2d", applies=lambda tiles, node: bool(group_tiles(tiles, node)),
    define_knobs=define_grouped_knobs, schedule=schedule_grouped, reference=_conv_reference,
    weight_layout=grouped_layout)
PIXELS = Strategy(
    "pixels", "nn.conv2d", applies=lambda tiles, node: is_pointwise(node),
    define_knobs=define_pixels_knobs, schedule=schedule_pixels, reference=_conv_reference,
    weight_layout=pixels_layout, keeps_stage=keeps_input_stage)
DEPTHWISE = Strategy(
    "depthwise", "nn.conv2d", applies=lambda tiles, node: is_depthwise(node),
    define_knobs=define_depthwise_knobs, schedule=schedule_depthwise, reference=_conv_reference,
    keeps_stage=keeps_padded_input)


def _unrolls_row(tiles: Tiles, node: ir.Node) -> bool:
    """Whether a layer unrolls its kernel row by default (:func:`.direct.define_direct_knobs`,
    the knob the ``channels`` layout shares; each tap's input then a load at a constant
    offset from the row's): a direct convolution of a row of 5 or more (ResNet's and
    Inception's 7x7/2 stems, Inception's 5x5 layers; 3x3 ones gained nothing: MobileNet-v2,
    ShuffleNet, SqueezeNet within 1%), and a strided ``channels`` layer where the target has
    32 vector registers. The stem: 1.40 -> 1.05 ms, two threads 0.70 -> 0.53 (AVX-512 code;
    AVX2 code 2.55 -> 2.35, 1.28 -> 1.19); ResNet-18 12.80 -> 12.49 ms, Inception-v1 12.49
    -> 12.08 | 7.98 -> 7.61 on two threads, DenseNet-121 27.8 -> 27.5 (A/B in one process).
    The strided ones, AVX-512 code, one | two threads: ResNet's 64 -> 128 3x3/2 671 -> 621 |
    375 -> 358 us, 128 -> 128 1346 -> 1245 | 713 -> 668, 256 -> 256 1206 -> 1127 | 720 ->
    694, 128 -> 256 570 -> 551 | 331 -> 321, 256 -> 512 and 512 -> 512 unchanged (ResNet-18
    and ResNet-50 whole within 1.6%, a noisy hour); aarch64 code of the first 80 -> 70
    instructions a step for the same 42 multiply-adds (21 -> 17 reads); AVX2 code (16
    registers) 5-10% slower that way; stride 1 unchanged (512 -> 512 on 7x7)."""
    default = candidates(tiles, node)[0]
    if default is CHANNELS:
        return tuple(node.attrs["strides"]) != (1, 1) and tiles.registers >= 32
    return default is DIRECT and node.inputs[1].shape[3] >= 5


#: the table, in the order the candidates' knobs are defined
CONV2D = (WINOGRAD, CHANNELS, GROUPED, DIRECT, PIXELS, DEPTHWISE)
_BY_LAYOUT = {"packed": CHANNELS, "winograd": WINOGRAD, "grouped": GROUPED, "pointwise": PIXELS}


def candidates(tiles: Tiles, node: ir.Node) -> list[Strategy]:
    """The strategies the ``layout`` knob offers for a convolution, the default first: a
    depthwise one has its own; Winograd where :func:`winograd_plan` has a plan (then alone:
    its weight is the transformed one); else the direct schedule, and the ``grouped`` or
    ``channels`` layout beside it where it is offered, first where :func:`grouped_default` or
    :func:`channels_default` says; a pointwise one the ``pixels`` strategy besides, first
    where :func:`pixels_default` says."""
    node = as_modelled(node)
    found = _candidates(tiles, node)
    if not PIXELS.applies(tiles, node):
        return found
    return [PIXELS, *found] if pixels_default(tiles, node) else [*found, PIXELS]


def _candidates(tiles: Tiles, node: ir.Node) -> list[Strategy]:
    if DEPTHWISE.applies(tiles, node):
        return [DEPTHWISE]
    if WINOGRAD.applies(tiles, node):
        return [WINOGRAD]
    if GROUPED.applies(tiles, node):
        return [GROUPED, DIRECT] if grouped_default(tiles, node) else [DIRECT, GROUPED]
    if not CHANNELS.applies(tiles, node):
        return [DIRECT]
    if channels_default(node, channel_tiles(tiles, node)):
        return [CHANNELS, DIRECT]
    return [DIRECT, CHANNELS]


def define_conv_knobs(cfg, tiles: Tiles, node: ir.Node, padded: bool):
    """The ``layout`` knob (not for depthwise layers: they have one strategy) and the knobs of
    every candidate; ``channels`` reads the direct strategy's ``reduce_order``, ``unroll_kw``
    and ``pad`` too."""
    found = candidates(tiles, node)
    node = as_modelled(node)
    if found != [DEPTHWISE]:
        cfg.define_knob("layout", [s.name for s in found])
    for strategy in CONV2D:
        if strategy in found:
            strategy.define_knobs(cfg, tiles, node, padded)


def conv2d_strategy(tiles: Tiles, node: ir.Node, cfg=None) -> Strategy:
    """The strategy of a convolution: the one its weight's layout names once ``relay.build``
    laid it out; else the configuration's ``layout`` choice (``cfg`` None or a space being
    defined: the default)."""
    layout = WeightLayout.of(node.attrs)
    if layout:
        return _BY_LAYOUT[layout.kind]
    found = candidates(tiles, node)
    if cfg is None or isinstance(cfg, ConfigSpace) or len(found) == 1:
        return found[0]
    chosen = cfg["layout"].val
    return next(s for s in found if s.name == chosen)
