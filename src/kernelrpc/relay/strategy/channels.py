"""The ``channels`` layout: output channels in the vector, the weight packed at build time
(``[O/V][I][KH][KW][V]``), a tile of vectors x rows x columns of outputs in registers."""
from __future__ import annotations

import math

from ...compiler.tiles import Tiles
from .common import accumulate_tile, divisors, output_tiles, schedule_inputs


def channel_tiles(tiles: Tiles, node) -> list[str]:
    """The register tiles of the ``channels`` layout, ``"VxRxC"``: ``V`` vectors of output
    channels x ``R`` rows x ``C`` columns of outputs, each dividing its extent (no tails
    inside the register tile; but pairs of rows on an odd map, :func:`odd_rows_in_pairs`),
    rows of at least 4 columns (or the whole row); accumulators
    and weight vectors at most the vector registers less 1 (the broadcast input of the FMAs)
    with ``V = 1``; with ``V > 1`` less 3 and the broadcast inputs too: each feeds ``V``
    FMAs, so LLVM keeps it in a register (2x1x14, 28 accumulators, spills: 14x14 3x3 58
    GFLOP/s against 1x2x14's 113; 2x1x13 on 13x13 55 against 1x1x13's 70-99). AVX2's 16
    registers then hold 1x1x13 and 1x2x7 (13 and 14 accumulators), which "less 3" refused:
    SqueezeNet's 512->1000 on 13x13, AVX2 code on an emeraldrapids core, 59 -> 77 GFLOP/s
    (direct columns -> 1x1x13), DenseNet's 992->128 on 14x14 59 -> 69 (1x1x7 -> 1x2x7).
    Best first: rows of at least 7 columns (LLVM unrolls a 3-wide window and keeps the inputs
    the columns share in registers: 1x5x5 on 55x55 3x3 48-58, 1x1x11 86-101), then two or
    more vectors of channels (each broadcast input feeds as many FMAs: AVX-512 code, ResNet-50's
    3x3/2 layers 2x1x7 against 1x4x7 or 1x2x14, 128 channels to 28x28 155 against 121, 256 to
    14x14 177 against 160), then most accumulators, then the shorter rows (28x28 512->128 1x1:
    1x4x7 111, 1x2x14 and 1x1x28 88).

    A strided layer of a window up to 3 wide on a target of 16 vector registers (AVX2, SSE,
    armv7 NEON) ranks two or more vectors of channels first, in tiles of as few as 2 columns
    (a stride's columns share few inputs, so the long rows gain little), the broadcast inputs
    held besides and one register spare, then most accumulators: AVX2 code on a Zen 2 core,
    ResNet-50's 3x3/2 layers, 128 -> 128 on 56x56 1x2x7 56.5 -> 2x1x4 74.2 GFLOP/s, 256 -> 256
    on 28x28 1x2x7 54.5 -> 2x2x2 72.0 (4x1x2 65.6, 2x1x7 spilling 49.5), 512 -> 512 on 14x14
    keeps 1x1x7 (68, 2x1x7 52); SSE code (`-mcpu=x86-64`) of the first two 18.0 -> 24.2 and
    16.7 -> 25.6; ResNet-50 93.7 -> 91.9 ms, ResNet-18 34.8 -> 34.2 (AVX2, one thread). ViT's
    16x16/16 patches were 2.7% slower in 2x2x2 tiles and keep the general rule.

    Empty where the layout is not offered: grouped or depthwise
    convolutions (their input channel would vary across the vector), output channels not a
    multiple of the lanes, a scalar target, other than float32 (the lanes are float32 lanes)."""
    lanes = tiles.lanes
    _, out_channels, height, width = node.shape
    if lanes < 2 or node.attrs["groups"] != 1 or out_channels % lanes or \
            node.inputs[1].dtype != "float32":
        return []
    few_registers_strided = tuple(node.attrs["strides"]) != (1, 1) and \
        node.inputs[1].shape[3] <= 3 and tiles.registers <= 16
    found = []
    for v in (1, 2, 3, 4):
        if out_channels % (v * lanes):
            continue
        narrow = v > 1 and few_registers_strided   # several vectors by a few pixels
        for r in divisors(height, 8) + ([2] if odd_rows_in_pairs(tiles, height) else []):
            for c in divisors(width, 28):
                if c < min(width, 2 if narrow else 4):
                    continue
                held = r * c if v > 1 else 0      # broadcasts LLVM keeps for several FMAs
                spare = 1 if v == 1 or narrow else 3   # one vector: one broadcast at a time
                if 4 <= v * r * c and v * r * c + v + held <= tiles.registers - spare:
                    rank = (v > 1, v * r * c, -v, c if v > 1 else c >= 7) \
                        if few_registers_strided else (c >= 7, v > 1, v * r * c)
                    found.append((*rank, -c, -v, r))
    found.sort(reverse=True)
    return [f"{-v}x{r}x{-c}" for *_, c, v, r in found[:8]]


def odd_rows_in_pairs(tiles: Tiles, height: int) -> bool:
    """Whether a map of an odd number of rows is offered tiles of 2 rows, the last one a row
    short (its guard outside the reduction: ``compiler.lower.unswitch``): on AVX2 (8 lanes,
    16 vector registers), where a 7x7 map's tiles were otherwise one row of 7 columns, 7
    accumulators waiting on the multiply-add's latency. AVX2 code on a Zen 2 core, one
    thread: ResNet's 512 -> 512 3x3 on 7x7 1x1x7 -> 1x2x7 3537 -> 3230 us alone, its 3x3/2
    from 14x14 3927 -> 3485; ResNet-18 34.65 -> 33.40 ms, two threads 17.81 -> 17.22;
    ResNet-50 87.74 -> 86.47, 51.91 -> 51.29 (A/B in one process, bitwise equal outputs).
    Not on 4 lanes: SSE code (a multiply and an add, no FMA) of ResNet-18 was 7% slower that
    way; targets of 32 registers keep their tiles of several vectors (not measured)."""
    return tiles.registers <= 16 and tiles.lanes >= 8 and height % 2 == 1 and height > 2


def channels_default(node, tiles_c) -> bool:
    """Whether the ``channels`` layout is the default: where it is offered, for a reduction
    (input channels x window) of at least 96 on maps up to 28 columns wide, of at least 256 on
    wider ones (whose rows fill the columns' vectors better).

    Measurements: docs/performance.md, "Why the defaults are what they are"."""
    _, inputs, kh, kw = node.inputs[1].shape[:4]
    reduction, width = inputs * kh * kw, node.shape[3]
    return bool(tiles_c) and reduction >= (96 if width <= 28 else 256)


#: a strided layer's cores share out bands of rows where its weight is at most this many bytes
ROWS_OUTER_WEIGHT_BYTES = 1 << 20


def rows_outer(node) -> bool:
    """Whether a ``channels`` layer is split between the cores by bands of output rows (its
    padded input too) rather than by channel blocks: a strided layer whose weight, read
    again for every band, stays in a core's cache (:data:`ROWS_OUTER_WEIGHT_BYTES`). By
    channel blocks each core read its whole input, four times its output's pixels, half of
    it from the other core's cache. AVX-512 code, two threads: ResNet-50's 128 -> 128 3x3/2
    on 56x56 0.91 -> 0.70 ms, ResNet-18's 64 -> 128 0.43 -> 0.38 (one thread 1-3% faster);
    256 -> 256 (2.4 MB) 0.73 -> 0.93 and stride 1 512 -> 512 on 7x7 0.58 -> 1.12 by rows."""
    strided = tuple(node.attrs["strides"]) != (1, 1)
    weight = node.inputs[1]
    return strided and 4 * math.prod(weight.shape) <= ROWS_OUTER_WEIGHT_BYTES


def schedule_channels(s, blocked, out, tiles: Tiles, cfg, node):
    """Output channels in the vector: ``blocked`` (``[n][O/V][h][w][V]``, the weight packed as
    ``[O/V][I][KH][KW][V]``) accumulates a tile of ``V`` vectors x ``R`` rows x ``C`` columns
    in registers over the reduction, each step one weight vector load per channel vector and
    one broadcast input value per position; the output stage writes the tile back as NCHW with
    the group's tail; the cores' shares by :func:`rows_outer`."""
    vectors, rows, cols = (int(v) for v in cfg["channel_tile"].val.split("x"))
    by_rows = rows_outer(node)
    s[blocked].compute_at(s[out], output_tiles(s[out], vectors * tiles.lanes, rows, cols,
                                               rows_outer=by_rows))
    accumulate_tile(s, blocked, cfg, blocks_in_tile=True)
    schedule_inputs(s, tiles, by_rows=by_rows)
