"""The ``grouped`` layout: the ``channels`` layout for a grouped convolution. Each group's
output channels fill whole vectors (the last padded with zero weights: ``WeightLayout``'s
``grouped`` kind), so that no vector holds two groups' channels and one broadcast input
value feeds every lane; a tile of rows x columns of outputs stays in registers while the
reduction runs, for each vector of the group in turn, the group's inputs staying in the
cache. ShuffleNet's grouped layers, one Emerald Rapids core, columns -> grouped: AVX2 code
5.87 -> 3.25 ms, AVX-512 code 2.52 -> 2.04 (docs/performance.md). One group of output
channels that whole vectors do not fill takes it too: SqueezeNet's 512 -> 1000 on 13x13,
AVX-512 code, 1.66 -> 1.44 ms (columns -> one group padded to 1008); the network 5.13 ->
4.91 ms, Inception-v1 23.2 -> 22.3 (A/B in one run)."""
from __future__ import annotations

from ...compiler.tiles import Tiles
from ..op.weight_layout import WeightLayout
from .common import accumulate_tile, divisors, output_tiles, schedule_inputs


def is_grouped(node) -> bool:
    """A grouped convolution that is not depthwise (its groups have several input channels)."""
    return node.attrs["groups"] > 1 and node.inputs[1].shape[1] > 1


def _takes(node, lanes: int) -> bool:
    """A grouped convolution, or one group of output channels that whole vectors do not fill
    (a classifier's 1000: the ``channels`` layout needs a multiple of the lanes)."""
    return is_grouped(node) or (node.attrs["groups"] == 1 and node.shape[1] % lanes != 0)


def grouped_layout(tiles: Tiles, node) -> WeightLayout:
    return WeightLayout.grouped(tiles.lanes, node.attrs["groups"], node.shape[1])


def group_tiles(tiles: Tiles, node) -> list[str]:
    """The register tiles, ``"RxC"``: ``R`` rows x ``C`` columns of one vector of outputs,
    each dividing its extent, rows of at least 4 columns (or the whole row), the accumulators
    and the weight vector at most the vector registers less 1 (the broadcast input). Best
    first: rows of a power of two columns (the output stage writes a tile's row as one vector
    of ``C`` lanes), then most accumulators, then the longer rows.
    Empty where the layout is not offered: not a grouped convolution, a group's channels
    padded by more than a third (fewer than 2 of a group's 3 lanes hold a channel), a scalar
    target, other than float32."""
    lanes = tiles.lanes
    _, out_channels, height, width = node.shape
    if lanes < 2 or not _takes(node, lanes) or node.inputs[1].dtype != "float32":
        return []
    per_group = out_channels // node.attrs["groups"]
    if 3 * per_group < 2 * grouped_layout(tiles, node).group_blocks * lanes:
        return []
    found = []
    for r in divisors(height, 8):
        for c in divisors(width, 28):
            if c >= min(width, 4) and 4 <= r * c and r * c + 1 <= tiles.registers - 1:
                found.append((c & (c - 1) == 0, r * c, c, r))
    found.sort(reverse=True)
    return [f"{r}x{c}" for _, _, c, r in found[:8]]


def grouped_default(tiles: Tiles, node) -> bool:
    """Whether the ``grouped`` layout is the default where it is offered: for a group's
    reduction (its input channels x window) of at least two vectors' worth. Each output is
    written back from its vector (a gather of lanes), once per reduction: ShuffleNet's groups
    of 6 input channels ran at 27-28 GFLOP/s against the columns' 50-83."""
    _, inputs, kh, kw = node.inputs[1].shape[:4]
    return inputs * kh * kw >= 2 * tiles.lanes


def define_grouped_knobs(cfg, tiles: Tiles, node, padded: bool):
    """The register tile; the reduction's order, the window's columns unrolled and the padded
    input's stage are the direct strategy's knobs."""
    cfg.define_knob("group_tile", group_tiles(tiles, node))


def schedule_grouped(s, blocked, out, tiles: Tiles, cfg, node):
    """``blocked`` (``[n][G*B][h][w][V]``) computed for one group's ``B`` vectors x a tile of
    ``R`` rows x ``C`` columns at a time, the vectors in a loop, each accumulating its tile in
    registers over the reduction; the output stage writes the group's tile back as NCHW with
    the group's tail, parallel over the batch, the groups and the row tiles."""
    rows, cols = (int(v) for v in cfg["group_tile"].val.split("x"))
    group = node.shape[1] // node.attrs["groups"]
    s[blocked].compute_at(s[out], output_tiles(s[out], group, rows, cols))
    accumulate_tile(s, blocked, cfg, blocks_in_tile=False)
    schedule_inputs(s, tiles)
