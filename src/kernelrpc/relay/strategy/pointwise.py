"""The ``pixels`` strategy of a pointwise convolution (1x1 kernel, no padding, one group):
the product of the ``[O][I]`` weight and the input's ``[I][H*W]`` pixels, as the
batched MatMul's register tile computes it (:mod:`.matmul`): ``tile_m`` output channels x
``tile_n`` pixels (whole vectors) over the whole reduction, one broadcast weight per channel
and one vector load per pixel vector a step. A channel's pixels are one contiguous run in
NCHW, so the tile runs along them across rows: a 13x13 or 28x28 map has no row tail inside
the tile and no lanes of a vector wasted on it, and no transpose writes the tile back. The
input is first copied into panels of a vector's pixels (:func:`pixels_layout`), a strided
layer's (ResNet's downsampling shortcuts) only the pixels it keeps, a quarter of its input
at stride 2."""
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
#: AVX-512 code's product runs over whole panels (:func:`pads_last_panel`) on small maps: a
#: 13x13 layer's last tile of 9 pixels, summed as a vector of 8 and a column whose 8 channels'
#: weights LLVM gathered, took as long as 2.3 full tiles. One thread, measured with the input
#: rows padded in place (before the panels): 512 -> 1000 channels on 13x13 1057 -> 836 us,
#: 512 -> 64 on 13x13 73.7 -> 60.0, 256 -> 1024 on 14x14 528 -> 503; on 27x27 and larger
#: maps the copy cost more than the last tile (128 -> 16 on 55x55: 74 -> 155 us); AVX2 code
#: (8 lanes) gained nothing (0-4% slower). A tail of 4 or 8 pixels is one short vector, not a
#: gather: with tiles of three vectors (:func:`pixel_tile`) a 14x14 map keeps its last tile
#: (DenseNet-121 28.8 -> 27.9 ms with both, one thread)
PADDED_MIN_LANES = 16
PADDED_MAX_PIXELS = 256
#: ... and a 7x7 map's product would grow by a third
PADDED_MIN_PIXELS = 128
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


def keeps_input_stage(op, anchor, cfg) -> bool:
    """The input's panels (without panels, a strided layer's kept pixels) are a stage of
    their own."""
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
    :data:`MIN_PARALLEL_TILES`); returns the loop over the outer tiles (fused with the batch)
    where it is the parallel one, else None, and the loop inside which a tile is
    accumulated."""
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
    if batch * _outer_tile_count(channels, height * width, cfg["tile_m"].val, pixels_per_tile,
                                 outer is fo) < MIN_PARALLEL_TILES:
        stage.parallel(inner)
        return None, inner
    outer = stage.fuse(n, outer)
    stage.parallel(outer)
    return outer, inner


def schedule_pixels(s, pixels, out, tiles: Tiles, cfg, node):
    """``pixels`` (``[n][O][H*W]``) accumulated in the output stage's tile
    (:func:`pixel_tiles`), the accumulators in registers over the reduction; the input's
    panels (:func:`..op.nn._conv2d_pixels`) written at the root, or where the pixel tiles
    are the outer, parallel loop, each one's panel inside it (the channel tiles then read it
    from L1 or L2, just written; where the threads share out the channel tiles instead, one
    thread alone would write it)."""
    cc = accumulator(s, pixels, out)
    lanes = max(tiles.lanes, 1)
    outer, inner = pixel_tiles(s, out, cfg, cfg["tile_n"].val, lanes)
    s[cc].compute_at(s[out], inner)
    register_tile(s[cc], lanes)
    panels = [st for st in s.stages if st.op.name == "pixel_panels"]
    if panels and outer is not None and cfg["pixel_order"].val == "pixels_outer":
        panels[0].compute_at(s[out], outer)
        panels[0].vectorize(panels[0].op.axis[-1])
    schedule_inputs(s, tiles)


def pads_last_panel(tiles: Tiles, node) -> bool:
    """Whether the product runs over whole panels: a vector of :data:`PADDED_MIN_LANES`
    lanes or more, on a map of :data:`PADDED_MIN_PIXELS` to :data:`PADDED_MAX_PIXELS` pixels
    whose last vector is not 4 or 8 pixels (a vector of their own), stride 1. The last,
    short tile of pixels is then whole vectors."""
    _, _, height, width = node.shape
    pixels = height * width
    tail = pixels % max(tiles.lanes, 1)
    return tiles.lanes >= PADDED_MIN_LANES and \
        PADDED_MIN_PIXELS <= pixels <= PADDED_MAX_PIXELS and tail not in (0, 4, 8) and \
        tuple(node.attrs["strides"]) == (1, 1)


#: fewest input and output channels of a layer that reads its input from panels
PANELS_MIN_CHANNELS = 128
#: fewest lanes of a target whose layers read panels (SSE code's 4 lanes gained nothing)
PANELS_MIN_LANES = 8


def _outer_tiles(tiles: Tiles, node) -> int:
    """How many outer tiles the default configuration's loop walks."""
    _, out_channels, height, width = node.shape
    in_channels = node.inputs[1].shape[1]
    rows, columns = pixel_tile(tiles)
    order = pixel_orders(out_channels, in_channels, height * width,
                         4 * out_channels * in_channels)[0]
    return _outer_tile_count(out_channels, height * width, min(rows, out_channels), columns,
                             order == "channels_outer")


def _outer_tile_count(channels: int, pixels: int, rows: int, columns: int,
                      channels_outer: bool) -> int:
    """The tiles of the outer loop: of ``rows`` channels where they are outer, else of
    ``columns`` pixels."""
    return -(-channels // rows) if channels_outer else -(-pixels // columns)


def reads_panels(tiles: Tiles, node) -> bool:
    """Whether the product reads its input from panels of a vector's pixels: on a target of
    :data:`PANELS_MIN_LANES` lanes or more, where the layer has :data:`PANELS_MIN_CHANNELS`
    input and output channels or more and its threads share out the outer tiles by default
    (:func:`pixel_tiles`), or where its product runs over whole panels
    (:func:`pads_last_panel`).

    Read in place, a tile's pixels of each input channel lie a whole map apart, each step's
    vectors spanning two cache lines, one run of the input for every channel, more than the
    hardware's prefetchers follow; a panel is one run. The copy pays where the reduction is
    long and many channel tiles read each panel. AVX2 code on a Zen 2 core, one thread, in
    place -> panels: ResNet-50's 2048 -> 512 on 7x7 1568 -> 1269 us, 1024 -> 512 on 14x14
    2768 -> 2130, 512 -> 2048 on 7x7 1392 -> 1239, 256 -> 512 /2 2466 -> 2193, 128 -> 512
    on 28x28 1131 -> 1040, 64 -> 256 on 56x56 1134 -> 1043 (but 607 -> 677 on two threads);
    MobileNet-v2's 960 -> 320 on 7x7 408 -> 382; few channels lost: 16 -> 96 on 112x112 436
    -> 515, 144 -> 24 on 56x56 221 -> 252, 384 -> 64 on 14x14 105 -> 110, ResNet-18's 64 ->
    128 /2 144 -> 164; MobileNet-v2's 960 -> 160 on 7x7 (4 tiles of pixels outside, the
    threads sharing each one's channel tiles) gained at one thread, 209 -> 196, lost at two,
    117 -> 137, and the network with it (2.9%). SSE code (4 lanes, no FMA): ResNet-50 and
    SqueezeNet within 0.3% either way. Not measured on 16 lanes (AVX-512), where a vector
    of 16 pixels in place spans two cache lines unless it starts on one."""
    _, in_channels = node.inputs[1].shape[:2]
    out_channels = node.shape[1]
    wide = min(in_channels, out_channels) >= PANELS_MIN_CHANNELS and \
        node.shape[0] * _outer_tiles(tiles, node) >= MIN_PARALLEL_TILES
    return tiles.lanes >= PANELS_MIN_LANES and (wide or pads_last_panel(tiles, node))


def pixels_layout(tiles: Tiles, node) -> WeightLayout:
    """The ``pointwise`` layout: its panels where :func:`reads_panels`, its weight by blocks
    of the default tile's rows (:func:`pixel_tile`), whatever the ``tile_m`` knob says (a
    task's configurations share its arguments).

    In a network a layer's weight comes from memory (ResNet-50's are 100 MB), and the model's
    ``[O][I]`` array gave a tile of 6 channels 6 runs a row apart, each a few cache lines
    long, which the prefetchers barely follow; in blocks a tile's weights are one run, the
    layer's one stream. AVX2 code on a Zen 2 core, in the network, one thread: ResNet-50's 256
    -> 1024 on 14x14 1373 -> 1183 us, 512 -> 2048 on 7x7 1544 -> 1369; ResNet-50 88.36 ->
    85.91 ms | 51.93 -> 50.32 on two threads, MobileNet-v2 5.72 -> 5.60 | 4.96 -> 4.73,
    SqueezeNet 7.07 -> 6.89 | 5.19 -> 5.07 (in blocks only where the layer reads panels,
    ResNet-50 2.7% faster and MobileNet-v2 unchanged: blocks everywhere gained 0.7% and 2.3%
    more); SSE code 0.4-1% faster."""
    panel = tiles.lanes if reads_panels(tiles, node) else 0
    out_channels = node.shape[1]
    return WeightLayout.pointwise(panel, pads_last_panel(tiles, node),
                                  min(pixel_tile(tiles)[0], out_channels), out_channels)
