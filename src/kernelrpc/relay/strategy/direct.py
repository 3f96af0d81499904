"""The direct convolution: a register tile of output channels x output columns (whole
vectors of columns) over the reduction, the group's tail on the tile in registers."""
from __future__ import annotations

from ...compiler.recipes import conv2d_register_tile
from ...compiler.tiles import Tiles
from .common import accumulator, choices, round_up, schedule_inputs


def schedule_direct(s, conv, out, tiles: Tiles, cfg, node):
    """The register tile (:func:`~kernelrpc.compiler.recipes.conv2d_register_tile`), the
    cores' shares bands of rows of the output and of the padded input alike: split by channel
    blocks, each core read half of its input from the other core's cache (MobileNet-v2's
    3 -> 32 3x3/2 layer, two threads, 157 -> 67 us, one thread 139 -> 141; ResNet-50's 7x7/2
    873 -> 721, one thread 1460 -> 1398, AVX-512 code)."""
    conv2d_register_tile(s, conv, out, accumulator(s, conv, out), cfg["tile_f"].val,
                         cfg["tile_x"].val, cfg["reduce_order"].val, cfg["unroll_kw"].val,
                         rows_outer=True)
    schedule_inputs(s, tiles, by_rows=True)


def define_direct_knobs(cfg, tiles: Tiles, node, padded: bool, unrolled_row: bool = False):
    """The register tile's output channels (``tile_f``) and columns (``tile_x``), the order of
    the reduction (input channels outside or inside the kernel window), the kernel row's
    columns unrolled or not (unrolled first with ``unrolled_row``: the layers
    ``conv2d._unrolls_row`` names, with its measurements), and the padded input a stage of
    its own (the default: each padded value is read by many output channels) or read in place
    through its bounds checks. The ``channels`` layout shares the last three."""
    _, out_channels, _, out_width = node.shape
    kernel_width = node.inputs[1].shape[3]
    lanes = tiles.lanes
    tile_x = default_columns(tiles, out_width)
    cfg.define_knob("tile_f", choices(default_channels(tiles, out_channels, tile_x),
                                      (4, 8, 12, 16, 24, 32),
                                      min(out_channels, 2 * tiles.conv_channels)))
    columns = [max(lanes // 2, 2), lanes, 2 * lanes, 3 * lanes] if lanes > 1 else [2, 4, 8]
    cfg.define_knob("tile_x", choices(tile_x, columns, round_up(out_width, max(lanes, 2))))
    cfg.define_knob("reduce_order", ["channels_outer", "window_outer"])
    unrolled = [True, False] if unrolled_row else [False, True]
    cfg.define_knob("unroll_kw", unrolled if kernel_width > 1 else [False])
    cfg.define_knob("pad", ["stage", "inline"] if padded else ["stage"])


def default_channels(tiles: Tiles, out_channels: int, columns: int) -> int:
    """The register tile's output channels by default: the target's, and where the row leaves
    the tile fewer columns than the target's (:func:`default_columns`), up to as many more as
    keep the target's accumulators, the most that divide the output channels (none left to a
    tail). Six accumulators of one vector each wait on the multiply-add's latency: SqueezeNet's
    111-wide 3 -> 64 3x3/2 stem in tiles of 6 x 8 743 us, 8 x 8 673 (12 x 8 711, 12 not
    dividing 64; AVX2 code on a Zen 2 core, one thread, alone)."""
    vectors = tiles.conv_columns // max(columns, 1)
    more = [d for d in range(tiles.conv_channels + 1, tiles.conv_channels * vectors + 1)
            if out_channels % d == 0]
    return max(more, default=tiles.conv_channels)


def default_columns(tiles: Tiles, out_width: int) -> int:
    """The register tile's columns by default: whole vectors, at most the target's tile, that
    leave the fewest columns to the row's tail (a tail runs as a serial loop), the widest on a
    tie. A tile wider than the row would be cut to a vector of the row's width: 13 lanes on
    AVX2 are two registers' worth of shuffles and spills (SqueezeNet's 13x13 1x1 layers ran
    at 5 GFLOP/s as one 13-lane tile, at 70 as 8 + 5 columns)."""
    lanes = tiles.lanes
    if lanes < 2 or out_width < lanes:
        return tiles.conv_columns
    widths = range(lanes, tiles.conv_columns + 1, lanes)
    return max(widths, key=lambda t: (out_width - out_width % t, t))
