"""The integer layers' strategy tables (:mod:`kernelrpc.relay.op.quant`), each record's
reference the operator's numpy form.

``qnn.conv2d`` with its weight packed (``int8_channels``: 16 output channels x 4 input
channels, the importer's choice where the layer has one group, an int8 weight and a constant
zero point) accumulates a register tile of rows x columns of outputs, each a vector of 16
int32 channels, over the input's quads of channels; a packed ``qnn.dense`` (``int8_tile``) a
tile of rows x blocks of 16 outputs likewise. Each has one record per instruction of a quad
step (:mod:`.int8_dots`: ``vpdpbusd`` with AVX512-VNNI, ``vpmaddubsw`` and ``vpmaddwd``
with AVX2 or AVX512BW, on the weights or, where they could saturate it, on their halves,
aarch64's ``sdot`` or, without the dot product, ``smull``, armv7 NEON's ``vmlal``, plain
vectors elsewhere), the first that applies taken, each computing the exact int32 sum. A
pointwise layer of whole vectors of 16 pixels (``int8_pixels``, the build's choice:
:func:`~kernelrpc.relay.op.quant.is_pixels_layer`) takes the same records the other way
round: 16 pixels of a channel in the vector, the channel's 4 weights broadcast, so that the
output stage requantizes and stores each vector as it is; so does a layer of few input
channels over its window's taps (:func:`~kernelrpc.relay.op.quant.is_window_layer`, the
build's choice for the target: :func:`window_triples`).
Depthwise convolutions and the rest (a centered uint8 weight, a run-time zero point) run the
float layers' schedules (depthwise, direct, the dense layer's orders) on the accumulation,
float32 where its sums are exact in it (:func:`~kernelrpc.relay.op.quant.sums_exact_in_float`),
else int32. The requantizing output stage works on the tile in registers.
``qnn.column_reduce`` (DynamicQuantizeLinear's range) has its columns in vectors."""
from __future__ import annotations

import math

from ...compiler.tensor import ComputeOp
from ...compiler.tiles import Tiles
from ..op import get, quant
from .common import divisors, extents, output_tiles, parallel_outer, schedule_inputs
from .dense import DENSE
from .depthwise import PAD_PLACES, define_depthwise_knobs, is_depthwise, keeps_padded_input, \
    schedule_depthwise
from .direct import define_direct_knobs, schedule_direct
from .int8_dots import QUAD_DOTS, QuadDot
from .pointwise import pixel_orders, pixel_tiles
from .record import Strategy


def accumulation(tensor):
    """The int32 reduction stage of an integer layer: ``tensor`` itself (an int32 output) or
    the stage its requantizing output stage reads."""
    if tensor.op.reduce_axis:
        return tensor
    return next(t for t in tensor.op.input_tensors if getattr(t.op, "reduce_axis", None))


def _reference(fold):
    """numpy's answer of a layer, its other inputs (zero point, bias, multiplier) the node's
    constants."""
    def reference(data, weight, node):
        rest = [node_input.value for node_input in node.inputs[2:]]
        if any(v is None for v in rest):
            raise ValueError(f"{node.op}: the reference needs constant zero point, bias and "
                             "multiplier")
        return fold([data, weight, *rest], node.attrs)
    return reference


#: the most taps of a window form's reduction where a quad step is a ``vpmaddubsw`` and
#: ``vpmaddwd`` pair (AVX2, AVX512BW): a 7x7 window of 3 channels (147)
WINDOW_TRIPLES_PAIRS = 160


def window_triples(tiles: Tiles) -> int:
    """The most taps of a layer the window form computes on this target
    (:func:`~kernelrpc.relay.op.quant.is_window_layer`): a 7x7 stem's 147 where a quad step
    is a ``vpmaddubsw`` pair, whose quads the packed form pads from 3 channels to 4 and steps
    through 49 at a time (ResNet-18's 7x7/2 3 -> 64, one Zen 2 thread, AVX2 code, packed ->
    window 3400 -> 2850 us, onnxruntime's int8 3233; SSE code 27.2 -> 26.7 ms); else
    :data:`~kernelrpc.relay.op.quant.WINDOW_TRIPLES`, a 3x3 stem's 27 (one emeraldrapids
    thread, ``vpdpbusd``: MobileNet-v2's 3x3/2 3 -> 32 174 -> 123 us, ResNet-18's 7x7/2
    579 -> 676, so the 7x7 stays packed there; the Arm targets' not measured)."""
    return WINDOW_TRIPLES_PAIRS if tiles.int8_dot in ("avx2", "avx512bw") else \
        quant.WINDOW_TRIPLES


def is_packed(node) -> bool:
    return node.attrs.get("kernel_layout") in (quant.PACKED, quant.PACKED_DENSE)


def is_pixels(node) -> bool:
    """A weight the ``pixels`` form reads: a pointwise layer's, or a window's over its taps."""
    return node.attrs.get("kernel_layout") in (quant.PACKED_PIXELS, quant.PACKED_WINDOW)


def is_plain(node) -> bool:
    """An OIHW weight (the float layers' schedules on the accumulation)."""
    return not is_packed(node) and not is_pixels(node)


#: accumulator registers that hide the latency of a quad step's chain (``vpdpbusd``: 5
#: cycles, two a cycle)
LATENCY_REGISTERS = 12


def int8_tiles(tiles: Tiles, node, dot: QuadDot) -> list[str]:
    """The register tiles of the packed convolution, ``"RxC"`` or ``"RxCxB"``: ``R`` rows x
    ``C`` columns of outputs dividing the map, each ``B`` blocks of 16 int32 channels (a
    block one AVX-512 register, two AVX2 ones, four NEON ones) dividing the layer's, the
    accumulators at most the vector registers less the blocks' weights and what a step of
    ``dot`` holds besides. Best first: rows of at least 4 columns (or the whole row), then
    enough accumulators to hide a step's latency (:data:`LATENCY_REGISTERS`), one block, the
    most accumulators. A map whose rows' divisors leave too few accumulators takes more
    blocks: 512 channels on 7 x 7 (ResNet-18's last 3 x 3 layers, one emeraldrapids thread):
    1 x 7 (7 accumulators) 475 us, 1 x 7 x 2 306; on 56 x 56 and 14 x 14 maps 2 x 14 of one
    block stays (2 x 14 x 1 306 and 257 us; 1 x 4 x 4 340, 1 x 14 x 2 356)."""
    _, channels, height, width = node.shape
    per_block, weights, held = dot.registers(tiles)
    layer_blocks = -(-channels // quant.BLOCK_O)
    found = []
    for b in (1, 2, 4):
        if layer_blocks % b:
            continue
        free = tiles.registers - b * weights - held
        found += [(c >= min(width, 4), min(r * c * b * per_block, LATENCY_REGISTERS), b == 1,
                   r * c * b, c, r, b) for r in divisors(height, 4)
                  for c in divisors(width, 16) if r * c * b * per_block <= free]
    found.sort(reverse=True)
    return [f"{r}x{c}" if b == 1 else f"{r}x{c}x{b}" for *_, c, r, b in found[:8]] or ["1x1"]


def packed_tile(value: str) -> tuple[int, int, int]:
    """``(rows, columns, blocks)`` of an ``int8_tile`` knob's value, ``"RxC"`` (one block of
    16 channels) or ``"RxCxB"``."""
    parts = [int(v) for v in value.split("x")]
    return parts[0], parts[1], parts[2] if len(parts) > 2 else 1


def _define_packed_knobs(cfg, tiles: Tiles, node, dot: QuadDot):
    cfg.define_knob("int8_tile", int8_tiles(tiles, node, dot))
    cfg.define_knob("pad", ["stage"])


def schedule_packed(s, anchor, out, tiles: Tiles, cfg, node, dot: QuadDot):
    """The output stage by blocks of 16 channels x ``R`` rows x ``C`` columns, parallel over
    the batch, the channel blocks and the row tiles; the accumulation of the tile inside it,
    its reduction over the window, then the quads (two a step where they are even), then each
    quad's 4 bytes, the 16 channels in the vector. The quads innermost: LLVM unrolls a loop
    of the window's 3 columns whole and shares the broadcast input words of neighbouring
    columns between its copies, more than the registers hold (a vpdpbusd tile's loop of 84
    steps moved them to the stack and back 77 times)."""
    acc = accumulation(anchor)
    rows, cols, blocks = packed_tile(cfg["int8_tile"].val)
    s[acc].compute_at(s[out], output_tiles(s[out], quant.BLOCK_O * blocks, rows, cols))
    _, cb, cy, cx, cv = s[acc].op.axis
    rc, ry, rx, ri = s[acc].op.reduce_axis
    rco, rci = s[acc].split(rc, factor=max(divisors(rc.extent.value, 2)))
    s[acc].unroll(rci)
    _quad_loops(s[acc], (ry, rx, rco, rci), (cb, cy, cx), cv, ri, dot, tiles, node)
    schedule_quads(s, acc)


def schedule_quads(s, acc):
    """The packed forms' input stage (``qquads``: each pixel's quads of 4 channels' bytes):
    parallel over its outer axes, vectors of 16 pixels along its last pixel axis (a row, or
    the pixels form's flattened pixels), a quad's 4 bytes unrolled, which
    :mod:`~kernelrpc.compiler.lower.interleave` makes one contiguous store of the 4 channels'
    vectors interleaved (byte by byte, it was most of a small layer's time: 32 -> 16 channels
    on 112 x 112, one thread, host code, 121 -> 56 us)."""
    quads = s[s[acc].op.input_tensors[0].op]
    *_, row, byte = quads.op.axis
    quads.vectorize(quads.split(row, factor=min(quant.BLOCK_O, extents(quads)[-2]))[1])
    quads.unroll(byte)
    parallel_outer(s, quads, kept=2)


def _define_pixels_knobs(cfg, tiles: Tiles, node, dot: QuadDot):
    """``tile_m`` channels x ``tile_n`` vectors of 16 pixels in registers, dividing the
    layer: by default the most accumulators within the vector registers less a vector of
    pixels' input bytes for each of the ``tile_n`` and what a step of ``dot`` holds besides,
    then the most vectors of pixels (each channel's weights are one broadcast word a step,
    each vector's inputs one load); ``pixel_order`` as the float ``pixels`` strategy's
    (:func:`.pointwise.define_pixels_knobs`)."""
    _, channels, height, width = node.shape
    vectors = height * width // quant.BLOCK_O
    per_block, inputs, held = dot.registers(tiles)
    fits = sorted(((m * n, n, m) for m in divisors(channels, 16) for n in divisors(vectors, 8)
                   if (m * n * per_block + n * inputs + held) <= tiles.registers),
                  reverse=True)
    _, n, m = fits[0] if fits else (1, 1, 1)
    cfg.define_knob("tile_m", [m] + [v for v in divisors(channels, 16) if v != m])
    cfg.define_knob("tile_n", [n] + [v for v in divisors(vectors, 8) if v != n])
    in_channels = node.inputs[0].shape[1] * math.prod(node.attrs.get("window", (1, 1)))
    cfg.define_knob("pixel_order", pixel_orders(channels, in_channels, height * width,
                                                channels * in_channels))
    cfg.define_knob("pad", ["stage"])


def schedule_pixels(s, anchor, out, tiles: Tiles, cfg, node, dot: QuadDot):
    """The output stage's rows and columns fused into one pixel axis, by tiles of
    ``tile_m`` channels x ``tile_n`` vectors of 16 pixels (each a contiguous run of the
    output, requantized and stored as it is), parallel over the outer tiles; the tile's
    accumulation inside, the reduction's quads (two a step where they are even) outside the
    tile, each step the record's intrinsic over a vector's 16 pixels x 4 bytes."""
    acc = accumulation(anchor)
    _, tile = pixel_tiles(s, out, cfg, cfg["tile_n"].val * quant.BLOCK_O, quant.BLOCK_O)
    s[acc].compute_at(s[out], tile)
    _, co, cpv, cpl = s[acc].op.axis
    rc, ri = s[acc].op.reduce_axis
    rco, rci = s[acc].split(rc, factor=max(divisors(rc.extent.value, 2)))
    s[acc].unroll(rci)
    _quad_loops(s[acc], (rco, rci), (co, cpv), cpl, ri, dot, tiles, node, pixels=True)
    schedule_quads(s, acc)


def _quad_conv(dot: QuadDot, form: str, is_form, define_knobs, schedule) -> Strategy:
    """The record of a packed convolution's ``form`` (``channels`` or ``pixels``) with the
    quad step ``dot``."""
    return Strategy(
        f"int8_{form}_{dot.name}", "qnn.conv2d",
        applies=lambda tiles, node: is_form(node) and dot.applies(tiles, node),
        define_knobs=lambda cfg, tiles, node, padded: define_knobs(cfg, tiles, node, dot),
        schedule=lambda s, anchor, out, tiles, cfg, node: schedule(
            s, anchor, out, tiles, cfg, node, dot),
        reference=_reference(quant.np_qconv2d))


QCONV2D_PACKED = tuple(_quad_conv(dot, "channels", is_packed, _define_packed_knobs,
                                  schedule_packed) for dot in QUAD_DOTS)
QCONV2D_PIXELS = tuple(_quad_conv(dot, "pixels", is_pixels, _define_pixels_knobs,
                                  schedule_pixels) for dot in QUAD_DOTS)


def _depthwise_pad(tiles: Tiles, node) -> str:
    """Where an integer depthwise layer reads its padded input (:data:`.depthwise.PAD_PLACES`):
    one channel's plane (a strided layer's phases) centered and converted to float once in
    the channel's loop, where read in place each of the window's taps converted its input
    again; but in place where the staged plane's short or strided rows cost more than the
    conversions, on 16-lane targets (AVX-512, whose masked byte loads are one instruction
    each) a map of 7 pixels and a strided layer from fewer than 56, and a strided layer from
    56 or more staged by bands of output rows (its float plane, 4 x 114 x 114 bytes from 112,
    is past L1).

    One thread, MobileNet-v2's layers, us, in place / in the channel's loop / converted whole
    at the root, since the padded reads' selects are left to the map's edges (loop
    partitioning) and strided layers stage their phases: AVX2 code, stride 1 on 112, 56, 28,
    14, 7 276/245/308, 324/277/347, 117/102/100, 162/57/60, 140/48/55; stride 2 from 112, 56,
    28, 14 347/302/585, 166/125/161, 77/70/75, 149/41/58; SSE code (``-mcpu=x86-64``) 539/423/
    479, 618/474/524, 214/154/156, 130/90/91, 133/67/66; 882/628/687, 367/226/218, 171/96/106,
    145/79/101. AVX-512 code before (its rule's measurements, not repeated since): 132/105,
    240/129, 64/54, 33/29, 30/49; 229/206, 84/69, 29/42, 27/52 (by bands of 4 rows: from
    112 242 -> 189, from 56 79 -> 71)."""
    width = node.inputs[0].shape[3]
    strided = tuple(node.attrs["strides"]) != (1, 1)
    if tiles.lanes >= 16:
        if strided:
            return "band" if width >= 56 else "inline"
        return "channel" if width >= 14 else "inline"
    return "channel"


#: an integer depthwise layer's input places: :data:`.depthwise.PAD_PLACES`, and ``convert``:
#: the whole input centered and converted to float at the root (in one pass of whole
#: vectors), then read in place as a float layer's
QPAD_PLACES = (*PAD_PLACES, "convert")


def _keeps_depthwise_stage(op, anchor, cfg) -> bool:
    """The padded input where the ``pad`` knob stages it; the centered input for ``convert``."""
    converts = cfg["pad"].val == "convert"
    if op.tag == "qcenter":
        return converts
    return keeps_padded_input(op, anchor, cfg) and not converts


def schedule_qdepthwise(s, anchor, out, tiles: Tiles, cfg, node):
    """The float depthwise schedule on the accumulation; with ``pad`` ``convert`` the centered
    input a stage at the root: each channel's plane one run of vectors, parallel over the
    channels."""
    schedule_depthwise(s, accumulation(anchor), out, tiles, cfg, node)
    for stage in s.stages:
        if isinstance(stage.op, ComputeOp) and stage.op.tag == "qcenter" and \
                stage.attach_type == "root":
            n, c, y, x = stage.op.axis
            stage.parallel(stage.fuse(n, c))
            stage.vectorize(stage.split(stage.fuse(y, x), factor=max(tiles.lanes, 1))[1])


QDEPTHWISE = Strategy(
    "int8_depthwise", "qnn.conv2d",
    applies=lambda tiles, node: is_plain(node) and is_depthwise(node),
    define_knobs=lambda cfg, tiles, node, padded: define_depthwise_knobs(
        cfg, tiles, node, padded, _depthwise_pad(tiles, node), QPAD_PLACES),
    schedule=schedule_qdepthwise, reference=_reference(quant.np_qconv2d),
    keeps_stage=_keeps_depthwise_stage)
QCONV2D = Strategy(
    "int8_direct", "qnn.conv2d", applies=lambda tiles, node: is_plain(node),
    define_knobs=define_direct_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: schedule_direct(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qconv2d))


def _define_packed_dense_knobs(cfg, tiles: Tiles, node, dot: QuadDot):
    """``tile_m`` rows x ``tile_b`` blocks of 16 outputs in registers: by default the most
    accumulators within the vector registers less the blocks' weights and what a step of
    ``dot`` holds besides, more blocks first (64x1024x256 on one emeraldrapids core with
    ``vpdpbusd``: 6 x 4 and 8 x 2 42 us, 4 x 2 64 us, 2 x 4 62 us)."""
    rows, columns = node.shape[-2:]
    blocks = -(-columns // quant.BLOCK_O)
    per_block, weights, held = dot.registers(tiles)
    fits = sorted(((m * b, b, m) for m in (1, 2, 4, 6, 8) for b in (1, 2, 4)
                   if m <= rows and b <= blocks and
                   m * b * per_block <= tiles.registers - b * weights - held), reverse=True)
    _, b, m = fits[0] if fits else (1, 1, 1)
    cfg.define_knob("tile_m", [m] + [v for v in (1, 2, 4, 6, 8) if v != m and v <= rows])
    cfg.define_knob("tile_b", [b] + [v for v in (1, 2, 4) if v != b and v <= blocks])
    cfg.define_knob("pad", ["stage"])


def schedule_packed_dense(s, anchor, out, tiles: Tiles, cfg, node, dot: QuadDot):
    """A register tile of ``tile_m`` rows x ``tile_b`` blocks of 16 outputs over the
    reduction's quads, parallel over the column tiles (a block of the weight stays in cache
    across the row tiles), each quad's 4 bytes and 16 outputs one dot-product instruction
    where the target has it."""
    acc = accumulation(anchor)
    rows, blocks = cfg["tile_m"].val, cfg["tile_b"].val
    stage = s[out]
    *batch, i, j = stage.op.axis             # N-D data: its leading dimensions outside
    jo, ji = stage.split(j, factor=blocks * quant.BLOCK_O)
    io, ii = stage.split(i, factor=rows)
    jb, jv = stage.split(ji, factor=quant.BLOCK_O)
    stage.reorder(jo, *batch, io, ii, jb, jv)
    stage.unroll(ii)
    stage.unroll(jb)
    stage.vectorize(jv)
    s[acc].compute_at(stage, io)
    stage.parallel(jo)
    ci, cb, cv = s[acc].op.axis
    rq, ri = s[acc].op.reduce_axis
    _quad_loops(s[acc], (rq,), (ci, cb), cv, ri, dot, tiles, node)
    schedule_inputs(s, tiles)


def _quad_loops(stage, reduction, tile, vector, quad, dot: QuadDot, tiles: Tiles, node,
                pixels: bool = False):
    """The accumulation's loops: the reduction outside, the register tile unrolled, then a
    block's 16 outputs (channels, or with ``pixels`` pixels) x a quad's 4 bytes as the
    record's intrinsic or, without one, the quad unrolled over vectors of the 16 outputs."""
    for axis in tile:
        stage.unroll(axis)
    if dot.intrinsic is not None:
        stage.reorder(*reduction, *tile, vector, quad)
        stage.tensorize(vector, dot.intrinsic(tiles, node)(pixels))
    else:
        stage.reorder(*reduction, *tile, quad, vector)
        stage.unroll(quad)
        stage.vectorize(vector)


def _packed_dense(dot: QuadDot) -> Strategy:
    return Strategy(
        f"int8_tile_{dot.name}", "qnn.dense",
        applies=lambda tiles, node: is_packed(node) and dot.applies(tiles, node),
        define_knobs=lambda cfg, tiles, node, padded: _define_packed_dense_knobs(
            cfg, tiles, node, dot),
        schedule=lambda s, anchor, out, tiles, cfg, node: schedule_packed_dense(
            s, anchor, out, tiles, cfg, node, dot),
        reference=_reference(quant.np_qdense))


QDENSE_PACKED = tuple(_packed_dense(dot) for dot in QUAD_DOTS)
QDENSE = Strategy(
    "int8_dense", "qnn.dense", applies=lambda tiles, node: not is_packed(node),
    define_knobs=DENSE.define_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: DENSE.schedule(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qdense))


def schedule_column_reduce(s, anchor, out, tiles: Tiles, cfg, node):
    """Vectors of columns, parallel, each over every row (the reduction inside the vector)."""
    stage = s[anchor]
    (column,) = stage.op.axis
    outer, inner = stage.split(column, factor=max(tiles.lanes, 1))
    stage.reorder(outer, *stage.op.reduce_axis, inner)
    stage.vectorize(inner)
    stage.parallel(outer)


COLUMN_REDUCE = Strategy(
    "columns", "qnn.column_reduce", applies=lambda tiles, node: True,
    define_knobs=lambda cfg, tiles, node, padded: None, schedule=schedule_column_reduce,
    reference=lambda data, weight, node: get(node.op).fold([data], node.attrs))

#: the integer layers' tables, by operator
INT8 = {"qnn.conv2d": (*QCONV2D_PACKED, *QCONV2D_PIXELS, QDEPTHWISE, QCONV2D),
        "qnn.dense": (*QDENSE_PACKED, QDENSE),
        "qnn.column_reduce": (COLUMN_REDUCE,)}
