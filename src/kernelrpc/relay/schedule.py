"""Default schedules for fused groups, and the group's tensor expression.

The group's elementwise and injective stages are inlined into its output stage. An anchor's
reductions keep stages of their own: a convolution or dense layer is computed inside the
output's register tile (the tail of the group then runs on values still in registers), as
``kernelrpc.compiler.recipes.conv2d_nchw`` does; pooling and other reductions are computed at
the root, their outer loop parallel.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import te
from ..autotvm.space import ConfigSpace
from ..compiler.tensor import ComputeOp
from ..compiler.vector_isa import vector_isa
from .fuse import Group
from .op import OPS
from .op import winograd
from .op.nn import packed_lanes

@dataclass(frozen=True)
class Tiles:
    """Register tiles of the default schedules for one target: a convolution keeps
    ``conv_channels`` output channels x ``conv_columns`` output columns (whole vectors) in
    registers over its reduction; a dense layer vectors of ``dense_lanes`` outputs;
    ``registers`` vector registers bound the tiles of a convolution's ``channels`` layout."""

    lanes: int
    conv_channels: int
    conv_columns: int
    dense_lanes: int
    registers: int


def tiles_for(target) -> Tiles:
    """Tiles from the target's vector unit (:func:`kernelrpc.compiler.vector_isa.vector_isa`:
    float32 lanes, how many registers), never from the host's.

    Measured on AVX-512 (znver5, one thread): 16 channels x 16 columns ran ResNet-18 at
    224x224 in 32 ms, 8 x 16 in 40, 24 x 16 in 43, 16 x 8 in 45 (docs/models.md). The
    other targets' tiles keep the same share of their register file for accumulators
    (emulated boards prove them correct, not fast)."""
    isa = vector_isa(target)
    if isa.lanes == 16:
        return Tiles(16, 16, 16, 16, 32)          # 16 of 32 zmm registers
    if isa.lanes == 8:
        return Tiles(8, 6, 16, 16, 16)            # 12 of 16 ymm registers
    if isa.lanes == 4 and isa.registers == 32:
        return Tiles(4, 12, 8, 16, 32)            # aarch64: 24 of 32 q registers
    if isa.lanes == 4 and target.arch.startswith(("arm", "thumb")):
        return Tiles(4, 4, 8, 8, 16)              # 8 of 16 q registers
    if isa.lanes == 4:
        return Tiles(4, 6, 8, 8, 16)              # SSE: 12 of 16 xmm registers
    return Tiles(1, 4, 4, 4, isa.registers)       # scalar floating-point registers


def group_tensors(group: Group):
    """``(placeholders, output)``: the group as a tensor expression over its inputs."""
    inputs = group.inputs()
    placeholders, tensors = [], {}
    for k, node in enumerate(inputs):
        p = te.placeholder(node.shape or (1,), name=f"in{k}", dtype=node.dtype)
        placeholders.append(p)
        tensors[id(node)] = p
    for node in group.nodes:
        out = OPS[node.op].compute([tensors[id(i)] for i in node.inputs], node.attrs, node)
        tensors[id(node)] = out
    return placeholders, tensors[id(group.output)], tensors.get(id(group.anchor))


def _extent(axis) -> int:
    return int(getattr(axis.extent, "value", axis.extent))


def _extents(stage):
    return [_extent(iv) for iv in stage.op.axis]


def _parallel_outer(s, stage):
    """Parallel over the leading axes (fused while they are short), vector-friendly inner."""
    axes = list(stage.op.axis)
    if not axes:
        return
    extents = _extents(stage)
    outer, size, k = axes[0], extents[0], 1
    while size < 16 and k < len(axes) - 1:
        outer = stage.fuse(outer, axes[k])
        size *= extents[k]
        k += 1
    if size > 1:
        stage.parallel(outer)


def schedule_group(group: Group, out, anchor, tiles: Tiles, cfg=None):
    """The group's schedule; ``cfg`` the configuration of its anchor (default: the target's
    default choices)."""
    cfg = ConfigSpace() if cfg is None else cfg
    s = te.create_schedule(out.op)
    anchor_kind = group.anchor.op if group.anchor is not None else None
    conv = anchor if anchor_kind == "nn.conv2d" else None
    dense = anchor if anchor_kind == "nn.dense" else None
    if conv is not None:
        if conv.op.tag == "conv2d_unblock":
            conv = conv.op.input_tensors[0]
        padded = any(isinstance(st.op, ComputeOp) and st.op.tag == "pad" for st in s.stages)
        define_conv_knobs(cfg, tiles, group.anchor, padded)
    transformed = conv is not None and winograd.layout_of(group.anchor.attrs)
    for stage in list(s.stages):
        op = stage.op
        if not isinstance(op, ComputeOp) or op is out.op:
            continue
        if op.reduce_axis:
            continue
        if transformed and (op.tag.startswith("wino_") or op is conv.op):
            continue
        if op.tag == "pad" and conv is not None and not transformed and \
                cfg["pad"].val == "stage":
            continue
        stage.compute_inline()
    if transformed:
        _schedule_winograd(s, out, winograd_band(transformed[0], group.anchor), tiles, cfg)
    elif conv is not None and packed_lanes(group.anchor.attrs):  # see conv_layout
        _schedule_conv_channels(s, conv, out, tiles, cfg)
    elif conv is not None and _depthwise(group.anchor):
        _schedule_depthwise(s, conv, out, tiles, cfg)
    elif conv is not None:
        _schedule_conv(s, conv, out, tiles, cfg)
    elif dense is not None:
        _schedule_dense(s, dense, out, tiles, cfg)
    else:
        for stage in s.stages:
            if isinstance(stage.op, ComputeOp) and stage.attach_type == "root" and \
                    stage.op is not out.op:
                _parallel_outer(s, stage)
        _parallel_outer(s, s[out])
    return s


def _accumulator(s, anchor, out):
    """The stage that accumulates the anchor's reduction in the output's tile: the anchor itself
    when an elementwise tail is the output, else a cache of the output (``cache_write``)."""
    return s.cache_write(out, "global") if anchor.op is out.op else anchor


def _choices(default: int, candidates, limit: int) -> list[int]:
    """``default`` first, then the candidates up to ``limit``, each once."""
    out = [default]
    out += [c for c in candidates if c <= limit and c not in out]
    return out


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _depthwise(node) -> bool:
    """Each output channel reads one input channel (a grouped convolution of one input
    channel per group)."""
    return node.attrs["groups"] > 1 and node.inputs[1].shape[1] == 1


def define_conv_knobs(cfg, tiles: Tiles, node, padded: bool):
    """The convolution's knobs: output channels and columns of the register tile, the order of
    the reduction (input channels outside or inside the kernel window), the kernel row's
    columns unrolled or not, and the padded input a stage of its own (the default: each padded
    value is read by many output channels) or read in place through its bounds checks. A
    depthwise convolution has knobs of its own (:func:`define_depthwise_knobs`).

    The ``layout`` knob: ``"columns"`` (the tile above: output columns in the vector) or
    ``"channels"`` (output channels in the vector, the weight packed at build time, the tile
    ``channel_tile``: see :func:`_schedule_conv_channels`), offered where the output channels
    fill whole vectors of an ungrouped convolution."""
    if _depthwise(node):
        define_depthwise_knobs(cfg, tiles, node, padded)
        return
    if _define_layout_knobs(cfg, tiles, node) == "winograd":
        return
    _, out_channels, _, out_width = node.shape
    kernel_width = node.inputs[1].shape[3]
    lanes = tiles.lanes
    cfg.define_knob("tile_f", _choices(tiles.conv_channels, (4, 8, 12, 16, 24, 32),
                                       min(out_channels, 2 * tiles.conv_channels)))
    columns = [max(lanes // 2, 2), lanes, 2 * lanes, 3 * lanes] if lanes > 1 else [2, 4, 8]
    cfg.define_knob("tile_x", _choices(tiles.conv_columns, columns,
                                       _round_up(out_width, max(lanes, 2))))
    cfg.define_knob("reduce_order", ["channels_outer", "window_outer"])
    cfg.define_knob("unroll_kw", [False, True] if kernel_width > 1 else [False])
    cfg.define_knob("pad", ["stage", "inline"] if padded else ["stage"])


#: most bytes of a Winograd layer's transformed input (and of its products) for one band of
#: tile rows: the stages run band by band, each band's in cache
WINOGRAD_BAND_BYTES = 2 << 20
#: most bytes of a Winograd layer's transformed weight
WINOGRAD_WEIGHT_BYTES = 6 << 20


def winograd_plan(tiles: Tiles, node) -> tuple[int, int] | None:
    """``(m, rows)`` of a layer that runs as Winograd's F(m x m, 3 x 3) by default, else None:
    an eligible 3x3 convolution (:func:`kernelrpc.relay.op.winograd.eligible`) on a vector
    target whose output channels fill whole vectors, a band of whose tiles
    (:func:`winograd_band`) has a divisor for the matrix products' register tile (``rows``
    positions x one vector of output channels). ``m`` is 4, or 2 on maps under 8 rows or
    columns (an F(4x4) tile would be mostly padding) or where F(4x4)'s transformed weight
    would be larger than :data:`WINOGRAD_WEIGHT_BYTES`, and none where F(2x2)'s would be.

    A network reads each layer's weight from memory once a run, and the transformed weight is
    ``(m+2)^2 / 9`` times the direct one's: in ResNet-18 (one core, in the network, direct ->
    F(4x4) -> F(2x2) us) 64->64 56x56 1040 -> 500 -> 710, 128->128 28x28 970 -> 460 -> 600,
    256->256 14x14 (F(4x4)'s weight 9.4 MB) 935 -> 800 -> 690, 512->512 7x7 (F(2x2)'s
    weight 16.8 MB) 1025 -> 1130 -> 1240.

    Measured on znver5, one core, 3x3 convolution, direct (the default before it) -> F(4x4)
    us: 64->64 56x56 1038 -> 451, 128->128 28x28 1003 -> 365, 256->256 14x14 907 -> 386
    (F(2x2) 496), 512->512 7x7 1233 -> F(2x2) 669 (F(4x4) 1003), 128->128 8x8 70 -> 39,
    8->32 56x56 72 -> 56, 16->64 55x55 288 -> 139, 32->128 27x27 222 -> 102, 64->256 13x13
    193 -> 109; run band by band (:func:`winograd_band`) where whole stages would stream
    through memory (whole stages -> bands, direct in brackets): 128->128 112x112 (14.4 MB a
    stage) 17560 -> 6413 (15930), 64->64 224x224 (29 MB) 33419 -> 9766 (16691), 64->64
    112x112 (7.2 MB) 1886 -> 1787 (4007); 256->256 56x56 F(2x2) 8544 (15693). Bands of
    512 KB ran ResNet-18 on two threads 5% slower than whole stages (more, smaller parallel
    loops), bands of 2 MB as fast."""
    if tiles.lanes < 4 or node.op != "nn.conv2d":
        return None
    transformed = winograd.layout_of(node.attrs)          # relay.build transformed its weight
    _, out_channels, height, width = node.shape
    if transformed is None and (not winograd.eligible(node) or out_channels % tiles.lanes or
                                node.inputs[0].shape[1] < 8):
        return None
    if transformed:
        sizes = [transformed[0]]
    else:
        in_channels = node.inputs[0].shape[1]
        sizes = [m for m in ((4, 2) if min(height, width) >= 8 else (2,))
                 if (m + 2) ** 2 * out_channels * in_channels * 4 <= WINOGRAD_WEIGHT_BYTES]
    for m in sizes:
        rows = _winograd_rows(tiles, _band_positions(m, node))
        if rows:
            return m, rows[0]
    return None


def winograd_band(m: int, node) -> int:
    """Tile rows of a band of a Winograd layer: the most that divide the map's tile rows
    with the band's transformed input (``(m+2)^2 x tiles x channels`` floats, and as many
    products) within :data:`WINOGRAD_BAND_BYTES`, at least one."""
    _, out_channels, height, width = node.shape
    th, tw = winograd.tiles(m, height, width)
    channels = max(out_channels, node.inputs[0].shape[1])
    fits = WINOGRAD_BAND_BYTES // ((m + 2) ** 2 * tw * channels * 4)
    return max(d for d in range(1, th + 1) if th % d == 0 and (d <= fits or d == 1))


def _band_positions(m: int, node) -> int:
    return winograd_band(m, node) * winograd.tiles(m, *node.shape[2:])[1]


def _winograd_rows(tiles: Tiles, positions: int) -> list[int]:
    """Register tiles of the matrix products: divisors of a band's tile count from 4 up to
    what the registers hold, largest first."""
    limit = min(14, tiles.registers - 4)
    return [d for d in range(limit, 3, -1) if positions % d == 0]


def define_winograd_knobs(cfg, tiles: Tiles, node):
    """A Winograd layer's knobs: the matrix products' register tile, ``gemm_rows`` tile
    positions x ``gemm_vectors`` vectors of output channels. The algorithm and ``m`` stay
    the default's (``layout`` has the one choice): the transformed weight's shape is ``m``'s,
    and a tuning task's weight argument is already transformed."""
    m, rows = winograd_plan(tiles, node)
    positions = _band_positions(m, node)
    cfg.define_knob("layout", ["winograd"])
    cfg.define_knob("gemm_rows", [rows] + [r for r in _winograd_rows(tiles, positions)
                                           if r != rows] +
                    [r for r in (2, 3) if positions % r == 0])
    blocks = node.shape[1] // tiles.lanes
    cfg.define_knob("gemm_vectors", [1, 2] if blocks % 2 == 0 else [1])


def depthwise_tile(tiles: Tiles, node) -> tuple[int, int]:
    """The default ``(rows, columns)`` of a depthwise convolution's register tile: one vector
    of columns (two on maps at least 6 vectors wide), 7 rows on maps of 7, 14 or 28 rows, else
    4, fewer where the accumulators and the window's weights would not fit the registers.

    Measured on znver4, one core, MobileNet-v2's depthwise layers with bias and clip, rows x
    columns -> us: 32 channels 112x112 4x32 69, 4x16 79, 2x16 98; 144 56x56 4x16 87, 7x16 95,
    4x32 116; 96 112x112 stride 2 4x16 143, 7x16 156, 4x32 239; 144 56x56 stride 2 7x16 64,
    4x16 72; 192 28x28 7x16 31, 4x16 36, 2x16 40; 384 14x14 7x16 19, 4x16 20, 2x16 22;
    960 7x7 7x16 13.5, 4x16 19, 2x16 17 (the columns schedule before it: 158, 187, 785, 285,
    69, 35, 27)."""
    _, _, height, width = node.shape
    kernel_height, kernel_width = node.inputs[1].shape[2:4]
    lanes = max(tiles.lanes, 2)
    columns = 2 * lanes if width >= 6 * lanes else lanes
    rows = 7 if height % 7 == 0 and height <= 28 else 4
    budget = tiles.registers - kernel_height * kernel_width - 2
    return max(1, min(rows, budget // (columns // lanes), height)), columns


def define_depthwise_knobs(cfg, tiles: Tiles, node, padded: bool):
    """A depthwise convolution's knobs: the output rows (``tile_y``) and columns (``tile_x``,
    whole vectors) of one channel's register tile (:func:`depthwise_tile`), and the padded
    input read in place (the default: each padded value is read by one output channel only)
    or a stage of its own."""
    _, _, out_height, out_width = node.shape
    lanes = max(tiles.lanes, 2)
    rows, columns = depthwise_tile(tiles, node)
    cfg.define_knob("tile_y", _choices(rows, (1, 2, 4, 7, 8), out_height))
    cfg.define_knob("tile_x", _choices(columns, (lanes // 2, lanes, 2 * lanes),
                                       _round_up(out_width, lanes)))
    cfg.define_knob("pad", ["inline", "stage"] if padded else ["stage"])


def channel_tiles(tiles: Tiles, node) -> list[str]:
    """The register tiles of the ``channels`` layout, ``"VxRxC"``: ``V`` vectors of output
    channels x ``R`` rows x ``C`` columns of outputs, each dividing its extent (no tails
    inside the register tile), rows of at least 4 columns (or the whole row); accumulators
    and weight vectors at most the vector registers less 3, and with ``V > 1`` the broadcast
    inputs too: each feeds ``V`` FMAs, so LLVM keeps it in a register (2x1x14, 28
    accumulators, spills: 14x14 3x3 58 GFLOP/s against 1x2x14's 113; 2x1x13 on 13x13 55
    against 1x1x13's 70-99). Best first: rows of at least 7 columns (LLVM unrolls a 3-wide
    window and keeps the inputs the columns share in registers: 1x5x5 on 55x55 3x3 48-58,
    1x1x11 86-101), then most accumulators, then the shorter rows (28x28 512->128 1x1: 1x4x7
    111, 1x2x14 and 1x1x28 88). Empty where the layout is not offered: grouped or depthwise
    convolutions (their input channel would vary across the vector), output channels not a
    multiple of the lanes, a scalar target, other than float32 (the lanes are float32 lanes)."""
    lanes = tiles.lanes
    _, out_channels, height, width = node.shape
    if lanes < 2 or node.attrs["groups"] != 1 or out_channels % lanes or \
            node.inputs[1].dtype != "float32":
        return []
    found = []
    for v in (1, 2, 3, 4):
        if out_channels % (v * lanes):
            continue
        for r in _divisors(height, 8):
            for c in _divisors(width, 28):
                if c < min(width, 4):
                    continue
                held = r * c if v > 1 else 0      # broadcasts LLVM keeps for several FMAs
                if 4 <= v * r * c and v * r * c + v + held <= tiles.registers - 3:
                    found.append((c >= 7, v * r * c, -c, -v, r))
    found.sort(reverse=True)
    return [f"{-v}x{r}x{-c}" for _, _, c, v, r in found[:8]]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def channels_default(node, tiles_c) -> bool:
    """Whether the ``channels`` layout is the default: where it is offered, for a reduction
    (input channels x window) of at least 96 on maps up to 28 columns wide, of at least 256 on
    wider ones (whose rows fill the columns' vectors better).

    Measured on znver4, one core, conv + bias + relu, the fastest of 9 interleaved runs,
    columns -> channels GFLOP/s: 7x7 maps 512->512 3x3 70 -> 105, 256->256 1x1 71 -> 101,
    576->160 1x1 76 -> 108, 160->960 1x1 54 -> 90; 14x14 1024->256 1x1 42 -> 111, 256->256
    3x3 96 -> 113, 384->96 1x1 79 -> 89, 96->576 1x1 97 -> 102; 28x28 512->128 1x1 71 -> 111,
    128->128 3x3 97 -> 112, 32->64 3x3 97 -> 107; strided 3x3 to 28x28 64->128 88 -> 99, to
    7x7 256->512 78 -> 110; 56x56 256->64 1x1 97 -> 98 (in ResNet-50 79 -> 93). A short
    reduction does not amortize the tile's write-back (a transpose to NCHW), so it keeps the
    columns: 14x14 64->384 1x1 95 -> 95, 56x56 64->256 1x1 104 -> 93, 16->64 3x3 110 -> 105,
    28x28 32->192 1x1 93 -> 81, 112x112 16->96 1x1 107 -> 61, ResNet's 7x7 stem (3 input
    channels, 147 a window) 102 -> 89."""
    _, inputs, kh, kw = node.inputs[1].shape[:4]
    reduction, width = inputs * kh * kw, node.shape[3]
    return bool(tiles_c) and reduction >= (96 if width <= 28 else 256)


def _define_layout_knobs(cfg, tiles: Tiles, node) -> str:
    """The ``layout`` knob (and the knobs of the layout it implies); returns its default."""
    if winograd_plan(tiles, node):
        define_winograd_knobs(cfg, tiles, node)
        return "winograd"
    tiles_c = channel_tiles(tiles, node)
    layouts = (["channels", "columns"] if channels_default(node, tiles_c)
               else ["columns", "channels"]) if tiles_c else ["columns"]
    cfg.define_knob("layout", layouts)
    if tiles_c:
        cfg.define_knob("channel_tile", tiles_c)
    return layouts[0]


def conv_layout(group: Group, tiles: Tiles, cfg) -> str:
    """The ``kernel_layout`` the weight of the group's OIHW convolution takes for its
    configuration (``cfg``; None or a space being defined: the default): ``"OIHW"`` (kept),
    ``"OIHW{V}o"`` (packed for the ``channels`` layout) or ``"winograd{m}_{V}o"``
    (transformed). Decided before the group's tensors are made: the packed weight is another
    tensor."""
    node = group.anchor
    if node is None or node.op != "nn.conv2d" or len(node.inputs[1].shape) != 4 or \
            packed_lanes(node.attrs) or _depthwise(node):
        return "OIHW"
    if cfg is None or isinstance(cfg, ConfigSpace):
        cfg = ConfigSpace()
        _define_layout_knobs(cfg, tiles, node)
    if cfg["layout"].val == "winograd":
        return winograd.kernel_layout(winograd_plan(tiles, node)[0], tiles.lanes)
    return f"OIHW{tiles.lanes}o" if cfg["layout"].val == "channels" else "OIHW"


#: most outputs of a ``rows`` dense layer's block (its accumulators, in L1)
DENSE_ROWS_BLOCK = 1024


def define_dense_knobs(cfg, tiles: Tiles, out_features: int, reduction: int):
    """The dense layer's knobs: the order of the weight's reads (``order``), outputs per
    vector tile, the reduction unrolled by a factor.

    ``"rows"`` (the default where :func:`dense_rows_block` finds a block): a block of outputs
    accumulates in memory (L1) while the reduction streams the weight's rows, each a
    contiguous slice. ``"columns"``: a vector tile of ``tile_n`` outputs in registers over
    the whole reduction, which walks down the weight's columns (one cache line per row, rows
    apart by the row's length). Measured on znver5, one core, columns -> rows: VGG-19's
    25088 x 4096 48.8 -> 21.5 ms (two cores 26.7 -> 12.3), 4096 x 4096 7.5 -> 3.1 ms, 9216 x
    4096 17.6 -> 8.0 ms; classifiers x 1000: 4096 256 -> 169 us, 2048 122 -> 77, 1280 74 ->
    47, 512 27 -> 19, 320 21 -> 11."""
    lanes = max(tiles.lanes, 2)
    cfg.define_knob("order", ["rows", "columns"] if dense_rows_block(tiles, out_features)
                    else ["columns"])
    cfg.define_knob("tile_n", _choices(tiles.dense_lanes, (lanes, 2 * lanes, 4 * lanes),
                                       _round_up(out_features, lanes)))
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


def _schedule_conv(s, conv, out, tiles: Tiles, cfg):
    cc = _accumulator(s, conv, out)
    stage = s[out]
    n, f, y, x = stage.op.axis
    fo, fi = stage.split(f, factor=cfg["tile_f"].val)
    xo, xi = stage.split(x, factor=cfg["tile_x"].val)
    stage.reorder(n, fo, y, xo, fi, xi)
    stage.vectorize(xi)
    stage.parallel(stage.fuse(stage.fuse(n, fo), y))
    s[cc].compute_at(stage, xo)
    _, cf, _, cx = s[cc].op.axis
    rc, ry, rx = s[cc].op.reduce_axis
    if cfg["reduce_order"].val == "channels_outer":
        s[cc].reorder(rc, ry, rx, cf, cx)
    else:
        s[cc].reorder(ry, rx, rc, cf, cx)
    if cfg["unroll_kw"].val:
        s[cc].unroll(rx)
    s[cc].unroll(cf)
    s[cc].vectorize(cx)
    _schedule_inputs(s, tiles)


def _schedule_depthwise(s, conv, out, tiles: Tiles, cfg):
    """One channel's tile of ``tile_y`` rows x ``tile_x`` columns in registers, its window
    unrolled: the rows' and the window's loads of one input row are the same load, so an
    input vector feeds up to ``KH`` rows' FMAs, and the channel's weights stay in registers."""
    cc = _accumulator(s, conv, out)
    stage = s[out]
    n, f, y, x = stage.op.axis
    yo, yi = stage.split(y, factor=cfg["tile_y"].val)
    xo, xi = stage.split(x, factor=cfg["tile_x"].val)
    stage.reorder(n, f, yo, xo, yi, xi)
    stage.parallel(stage.fuse(n, f))
    stage.unroll(yi)
    stage.vectorize(xi)
    s[cc].compute_at(stage, xo)
    _, _, cy, cx = s[cc].op.axis
    rc, ry, rx = s[cc].op.reduce_axis
    s[cc].reorder(rc, ry, rx, cy, cx)
    for axis in (ry, rx, cy):
        s[cc].unroll(axis)
    s[cc].vectorize(cx)
    _schedule_inputs(s, tiles)


def _schedule_inputs(s, tiles: Tiles):
    """The padded input at the root: parallel, vectorized."""
    for st in s.stages:
        if isinstance(st.op, ComputeOp) and st.op.tag == "pad" and \
                st.attach_type == "root":
            _parallel_outer(s, st)
            inner = st.op.axis[-1]
            if _extents(st)[-1] >= tiles.lanes > 1:
                st.vectorize(st.split(inner, factor=tiles.lanes)[1])


def _schedule_conv_channels(s, blocked, out, tiles: Tiles, cfg):
    """Output channels in the vector: ``blocked`` (``[n][O/V][h][w][V]``, the weight packed as
    ``[O/V][I][KH][KW][V]``) accumulates a tile of ``V`` vectors x ``R`` rows x ``C`` columns
    in registers over the reduction, each step one weight vector load per channel vector and
    one broadcast input value per position; the output stage writes the tile back as NCHW with
    the group's tail."""
    vectors, rows, cols = (int(v) for v in cfg["channel_tile"].val.split("x"))
    lanes = tiles.lanes
    stage = s[out]
    n, f, y, x = stage.op.axis
    fo, fi = stage.split(f, factor=vectors * lanes)
    yo, yi = stage.split(y, factor=rows)
    xo, xi = stage.split(x, factor=cols)
    stage.reorder(n, fo, yo, xo, fi, yi, xi)
    stage.parallel(stage.fuse(stage.fuse(n, fo), yo))
    stage.unroll(yi)
    if cols > 1:
        stage.vectorize(xi)
    s[blocked].compute_at(stage, xo)
    _, cb, cy, cx, cv = s[blocked].op.axis
    rc, ry, rx = s[blocked].op.reduce_axis
    if cfg["reduce_order"].val == "channels_outer":
        s[blocked].reorder(rc, ry, rx, cb, cy, cx, cv)
    else:
        s[blocked].reorder(ry, rx, rc, cb, cy, cx, cv)
    if cfg["unroll_kw"].val:
        s[blocked].unroll(rx)
    for axis in (cb, cy, cx):
        s[blocked].unroll(axis)
    s[blocked].vectorize(cv)
    _schedule_inputs(s, tiles)


def _schedule_winograd(s, out, band: int, tiles: Tiles, cfg):
    """The stages of :mod:`kernelrpc.relay.op.winograd` band by band of ``band`` tile rows
    (the output stage's outer loop), each stage parallel inside it: the input transform per
    tile and vector of input channels (the tile and its rows' transform in registers, every
    tile position unrolled), the matrix products a register tile of ``gemm_rows`` tiles x
    ``gemm_vectors`` vectors of output channels over the input channels, and the output
    transform inside the output stage's ``m x m`` tile per vector of output channels, which
    writes the tile back as NCHW with the group's tail."""
    stages = {st.op.tag: st for st in s.stages if isinstance(st.op, ComputeOp)}
    lanes = tiles.lanes
    m = _extent(stages["wino_cols"].op.axis[3])
    stage = s[out]
    n, f, y, x = stage.op.axis
    yb, yr = stage.split(y, factor=m * band)
    fo, fi = stage.split(f, factor=lanes)
    yo, yi = stage.split(yr, factor=m)
    xo, xi = stage.split(x, factor=m)
    stage.reorder(n, yb, fo, yo, xo, fi, yi, xi)
    stage.parallel(stage.fuse(fo, yo))
    stage.unroll(yi)
    stage.vectorize(xi)
    for tag in ("conv2d", "wino_cols"):
        inner = stages[tag]
        inner.compute_at(stage, xo)
        *_, a, b, v = inner.op.axis
        inner.unroll(a)
        inner.unroll(b)
        inner.vectorize(v)
    gemm = stages["wino_gemm"]
    gemm.compute_at(stage, yb)
    e1, e2, kb, p, kv = gemm.op.axis
    (rc,) = gemm.op.reduce_axis
    kbo, kbi = gemm.split(kb, factor=cfg["gemm_vectors"].val)
    po, pi = gemm.split(p, factor=cfg["gemm_rows"].val)
    gemm.reorder(e1, e2, kbo, po, rc, kbi, pi, kv)
    gemm.parallel(gemm.fuse(gemm.fuse(e1, e2), kbo))
    gemm.unroll(kbi)
    gemm.unroll(pi)
    gemm.vectorize(kv)
    source = stages["wino_input"]
    source.compute_at(stage, yb)
    e1, e2, p, c = source.op.axis
    co, ci = source.split(c, factor=lanes)
    source.reorder(p, co, e1, e2, ci)
    source.parallel(p)
    for axis in (e1, e2):
        source.unroll(axis)
    source.vectorize(ci)
    for tag in ("wino_rows", "wino_tile"):
        inner = stages[tag]
        inner.compute_at(source, co)
        _, i, j, c = inner.op.axis
        inner.unroll(i)
        inner.unroll(j)
        inner.vectorize(c)


def _schedule_dense(s, dense, out, tiles: Tiles, cfg):
    _, features = _extents(s[out])
    define_dense_knobs(cfg, tiles, features, _extent(dense.op.reduce_axis[0]))
    cc = _accumulator(s, dense, out)
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
        s[cc].reorder(k, cno, cni)
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
