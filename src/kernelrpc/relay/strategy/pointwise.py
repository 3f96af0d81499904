"""The ``pixels`` strategy of a pointwise convolution (1x1 kernel, no padding, one group):
the product of the ``[O][I]`` weight and the input's ``[I][H*W]`` pixels, as the
batched MatMul's register tile computes it (:mod:`.matmul`): ``tile_m`` output channels x
``tile_n`` pixels (whole vectors) over the whole reduction, one broadcast weight per channel
and one vector load per pixel vector a step. A channel's pixels are one contiguous run in
NCHW, so the tile runs along them across rows: a 13x13 or 28x28 map has no row tail inside
the tile and no lanes of a vector wasted on it, and no transpose writes the tile back. A
strided one (ResNet's downsampling shortcuts) first copies the pixels it keeps into a stage of
their own, a quarter of its input at stride 2."""
from __future__ import annotations

from ...compiler.recipes import register_tile
from ...compiler.tiles import Tiles
from ..op.weight_layout import WeightLayout
from .common import accumulator, extents, schedule_inputs
from .matmul import define_matmul_knobs, matmul_tile

#: fewest pixels for which the ``pixels`` strategy is the default
PIXELS_DEFAULT_MIN = 128
#: fewest pixels of a layer that widens its channels for the channel tiles to go outside
CHANNELS_OUTER_MIN_PIXELS = 27 * 27
#: a larger weight goes outside whatever the layer (read again for every tile of pixels,
#: it would come from beyond a core's L2)
CHANNELS_OUTER_WEIGHT_BYTES = 1 << 20
#: AVX-512 code reads a small map's input from rows padded to whole vectors
#: (:func:`row_align`): a 13x13 layer's last tile of 9 pixels, summed as a vector of 8 and a
#: column whose 8 channels' weights LLVM gathered, took as long as 2.3 full tiles, and rows
#: starting off a line made nearly every load span two. One thread: 512 -> 1000 channels on
#: 13x13 1057 -> 836 us, 512 -> 64 on 13x13 73.7 -> 60.0, 256 -> 1024 on 14x14 528 -> 503;
#: on 27x27 and larger maps the copy costs more than the last tile (128 -> 16 on 55x55: 74 ->
#: 155 us); AVX2 code (8 lanes) gained nothing (0-4% slower). A tail of 4 or 8 pixels is
#: one short vector, not a gather: with tiles of three vectors (:func:`pixel_tile`) a 14x14
#: map reads its input as it is (DenseNet-121 28.8 -> 27.9 ms with both, one thread)
ROWS_MIN_LANES = 16
ROWS_MAX_PIXELS = 256
#: ... and a 7x7 map's rows would grow by a third
ROWS_MIN_PIXELS = 128
#: with fewer outer tiles than this the threads share out each outer tile's inner tiles
#: instead (a 13x13 map has 6 tiles of 32 pixels, the last one short): 64 -> 256 channels
#: on 13x13, two threads, 31.5 -> 24.6 us; 1024 -> 256 on 14x14 313.9 -> 284.8 us; one
#: thread 1-2% slower (AVX-512 code)
MIN_PARALLEL_TILES = 8


def is_pointwise(node) -> bool:
    """A float32 1x1 convolution, unpadded, of one group."""
    weight = node.inputs[1]
    attrs = node.attrs
    return len(weight.shape) == 4 and tuple(weight.shape[2:]) == (1, 1) and \
        weight.dtype == "float32" and attrs["groups"] == 1 and \
        not any(attrs["padding"]) and "upsample" not in attrs


def keeps_subsample(op, anchor, cfg) -> bool:
    """A strided layer's kept pixels are a stage of their own."""
    return op.tag == "pad"


def pixels_default(tiles: Tiles, node) -> bool:
    """The ``pixels`` strategy is the default from :data:`PIXELS_DEFAULT_MIN` pixels (13x13
    maps and larger), and on smaller maps where the target has 16 vector registers or fewer;
    on 7x7 maps AVX-512's ``channels`` tiles (32 registers) are faster.
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    _, _, height, width = node.shape
    return height * width >= PIXELS_DEFAULT_MIN or tiles.registers <= 16


def pixel_orders(out_channels: int, in_channels: int, pixels: int,
                 weight_bytes: int) -> list[str]:
    """The ``pixel_order`` knob's values, the default first: ``channels_outer`` reads the
    whole input again for every tile of output channels, ``pixels_outer`` the whole weight for
    every tile of pixels. The channels go outside by default for a layer that widens its
    channels on a map of :data:`CHANNELS_OUTER_MIN_PIXELS` or more (MobileNet's expansions,
    ResNet's 1x1 to four times the width on 56x56 and 28x28: pixels outside, each tile wrote
    its rows a page apart) and for a weight past :data:`CHANNELS_OUTER_WEIGHT_BYTES`
    (SqueezeNet's 512 -> 1000); else the pixels (a narrowing layer's input, the 14x14 maps).
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    widens = out_channels > in_channels and pixels >= CHANNELS_OUTER_MIN_PIXELS
    orders = ["channels_outer", "pixels_outer"]
    return orders if widens or weight_bytes > CHANNELS_OUTER_WEIGHT_BYTES else orders[::-1]


def pixel_tile(tiles: Tiles) -> tuple[int, int]:
    """The default register tile, ``(channels, pixels)``: the matrix product's rows
    (:func:`.matmul.matmul_tile`) x three vectors of pixels where that leaves four registers
    for the operands (AVX-512 and aarch64: 8 x 48 and 8 x 12), else its two. Three vectors
    a step load the broadcast weights a third less often; AVX-512 code, one thread, pointwise
    layers alone: 256 -> 64 on 56x56 182 -> 198 GFLOP/s, 512 -> 128 on 28x28 208 -> 225, 256
    -> 128 on 56x56 197 -> 214, the others within 3%; ResNet-50 36.15 -> 35.90 ms | 20.59 ->
    20.10 on two threads, SqueezeNet 3.26 -> 3.21 | 2.14 -> 2.07, DenseNet-121 28.9 -> 28.6
    | 18.4 -> 17.9 (A/B in one process)."""
    rows, columns = matmul_tile(tiles)
    if tiles.lanes > 1 and 3 * rows + 4 <= tiles.registers:
        return rows, 3 * tiles.lanes
    return rows, columns


def define_pixels_knobs(cfg, tiles: Tiles, node, padded: bool):
    """The register tile (``tile_m`` output channels x ``tile_n`` pixels, default
    :func:`pixel_tile`) and which tiles the outer loop walks (:func:`pixel_orders`)."""
    _, out_channels, height, width = node.shape
    in_channels = node.inputs[1].shape[1]
    define_matmul_knobs(cfg, tiles, out_channels, height * width, pixel_tile(tiles))
    cfg.define_knob("pixel_order", pixel_orders(out_channels, in_channels, height * width,
                                                4 * out_channels * in_channels))


def pixel_tiles(s, out, cfg, pixels_per_tile: int, lanes: int):
    """The output stage (NCHW) by tiles of ``tile_m`` channels x ``pixels_per_tile`` pixels,
    its rows and columns fused into one pixel axis, the tile's vectors of ``lanes`` pixels one
    after another (a last tile's tail is a shorter vector, not a wider one), parallel over the
    outer tiles in ``pixel_order`` (over the inner ones where the outer ones are few:
    :data:`MIN_PARALLEL_TILES`); returns the loop inside which a tile is accumulated."""
    stage = s[out]
    n, f, y, x = stage.op.axis
    fo, fi = stage.split(f, factor=cfg["tile_m"].val)
    po, pi = stage.split(stage.fuse(y, x), factor=pixels_per_tile)
    outer, inner = (po, fo) if cfg["pixel_order"].val == "pixels_outer" else (fo, po)
    stage.reorder(n, outer, inner, fi, pi)
    pv, pl = stage.split(pi, factor=lanes)
    stage.unroll(fi)
    stage.unroll(pv)
    stage.vectorize(pl)
    batch, channels, height, width = extents(stage)
    outer_tiles = -(-channels // cfg["tile_m"].val) if outer is fo else \
        -(-height * width // pixels_per_tile)
    if batch * outer_tiles < MIN_PARALLEL_TILES:
        stage.parallel(inner)
    else:
        stage.parallel(stage.fuse(n, outer))
    return inner


def schedule_pixels(s, pixels, out, tiles: Tiles, cfg, node):
    """``pixels`` (``[n][O][H*W]``) accumulated in the output stage's tile
    (:func:`pixel_tiles`), the accumulators in registers over the reduction."""
    cc = accumulator(s, pixels, out)
    lanes = max(tiles.lanes, 1)
    s[cc].compute_at(s[out], pixel_tiles(s, out, cfg, cfg["tile_n"].val, lanes))
    register_tile(s[cc], lanes)
    schedule_inputs(s, tiles)


def row_align(tiles: Tiles, node) -> int:
    """The multiple of pixels the input's rows are padded to (0: as they are): a vector of
    :data:`ROWS_MIN_LANES` lanes or more, on a map of :data:`ROWS_MIN_PIXELS` to
    :data:`ROWS_MAX_PIXELS` pixels whose last vector is not 4 or 8 pixels (a vector of
    their own), stride 1. The last, short tile of pixels is then whole vectors and every row
    starts on a vector's boundary."""
    _, _, height, width = node.shape
    pixels = height * width
    tail = pixels % max(tiles.lanes, 1)
    pads = tiles.lanes >= ROWS_MIN_LANES and ROWS_MIN_PIXELS <= pixels <= ROWS_MAX_PIXELS and \
        tail not in (0, 4, 8) and tuple(node.attrs["strides"]) == (1, 1)
    return tiles.lanes if pads else 0


def pixels_layout(tiles: Tiles, node) -> WeightLayout:
    return WeightLayout.pointwise(row_align(tiles, node))
