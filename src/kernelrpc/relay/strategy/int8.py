"""The integer layers' strategy tables (:mod:`kernelrpc.relay.op.quant`), each record's
reference the operator's numpy form.

``qnn.conv2d`` with its weight packed (``int8_channels``: 16 output channels x 4 input
channels, the importer's choice where the layer has one group, an int8 weight and a constant
zero point) accumulates a register tile of rows x columns of outputs, each a vector of 16
int32 channels, over the input's quads of channels, a quad's 4 bytes x 16 channels one
``vpdpbusd`` where the target has AVX512-VNNI; a packed ``qnn.dense`` (``int8_tile``) a tile
of rows x blocks of 16 outputs likewise. Depthwise convolutions and the rest (a centered
uint8 weight, a run-time zero point) run the float layers' schedules (depthwise, direct, the
dense layer's orders) on the int32 accumulation. The requantizing output stage works on the
tile in registers. ``qnn.column_reduce`` (DynamicQuantizeLinear's range) has its columns in
vectors."""
from __future__ import annotations

from ... import te
from ...compiler import expr as E
from ...compiler import ir as tir
from ...compiler.ir_builder import create as ir_builder
from ..op import get, quant
from .channels import output_tiles
from .common import schedule_inputs
from .dense import DENSE
from .depthwise import define_depthwise_knobs, is_depthwise, schedule_depthwise
from .direct import define_direct_knobs, schedule_direct
from .record import Strategy
from .tiles import Tiles


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


def is_packed(node) -> bool:
    return node.attrs.get("kernel_layout") in (quant.PACKED, quant.PACKED_DENSE)


def int8_tiles(tiles: Tiles, node) -> list[str]:
    """The register tiles of the packed convolution, ``"RxC"``: ``R`` rows x ``C`` columns
    of outputs dividing the map, each a vector of 16 int32 channels (one AVX-512 register,
    two AVX2 ones, four NEON ones), the accumulators at most the vector registers less 4.
    Best first: rows of at least 4 columns (or the whole row), then the most accumulators."""
    _, _, height, width = node.shape
    per_vector = -(-quant.BLOCK_O // max(tiles.lanes, 1))
    found = [(c >= min(width, 4), r * c, c, r) for r in _divisors(height, 4)
             for c in _divisors(width, 16) if r * c * per_vector <= tiles.registers - 4]
    found.sort(reverse=True)
    return [f"{r}x{c}" for _, _, c, r in found[:8]] or ["1x1"]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _define_packed_knobs(cfg, tiles: Tiles, node, padded: bool):
    cfg.define_knob("int8_tile", int8_tiles(tiles, node))
    cfg.define_knob("pad", ["stage"])


def schedule_packed(s, anchor, out, tiles: Tiles, cfg, node):
    """The output stage by blocks of 16 channels x ``R`` rows x ``C`` columns, parallel over
    the batch, the channel blocks and the row tiles; the accumulation of the tile inside it,
    its reduction over the quads, the window and each quad's 4 bytes, the 16 channels in the
    vector."""
    acc = accumulation(anchor)
    rows, cols = (int(v) for v in cfg["int8_tile"].val.split("x"))
    s[acc].compute_at(s[out], output_tiles(s[out], quant.BLOCK_O, rows, cols))
    _, cb, cy, cx, cv = s[acc].op.axis
    rc, ry, rx, ri = s[acc].op.reduce_axis
    _quad_loops(s[acc], (rc, ry, rx), (cb, cy, cx), cv, ri, tiles)
    schedule_inputs(s, tiles)


def _quad_dot_intrinsic(name: str):
    """16 int32 accumulators += the 4 bytes of one quad of input channels (uint8, the same
    for every accumulator) times each accumulator's 4 weights (int8), as the one instruction
    ``name`` (x86's ``vpdpbusd``): the loops over a block's 16 channels and a quad's 4 bytes
    of the packed convolution's reduction."""
    quad = te.placeholder((quant.BLOCK_I,), name="quad", dtype="uint8")
    weight = te.placeholder((quant.BLOCK_O, quant.BLOCK_I), name="weight", dtype="int8")
    k = te.reduce_axis((0, quant.BLOCK_I), "k")
    dot = te.compute((quant.BLOCK_O,), lambda v: te.sum(
        E.cast(quad[k], "int32") * E.cast(weight[v, k], "int32"), axis=k), name="quad_dot")

    def fcompute(ins, outs):
        def step(first: bool):
            ib = ir_builder()
            data = E.reinterpret("int8x64", tir.Broadcast(
                E.reinterpret("int32", _vector(ins[0], quant.BLOCK_I)), quant.BLOCK_O))
            weights = _vector(ins[1], quant.BLOCK_O * quant.BLOCK_I)
            acc = tir.Broadcast(te.const(0, "int32"), quant.BLOCK_O) if first else \
                _vector(outs[0], quant.BLOCK_O)
            ib.emit(tir.Store(outs[0].data, E.call_llvm_pure_intrin(
                "int32x16", name, acc, data, weights), _lanes(outs[0], quant.BLOCK_O)))
            return ib.get()
        return step(True), None, step(False)
    return te.decl_tensor_intrin(dot.op, fcompute, name="quad_dot")


def _lanes(view, count: int):
    """The flat indices of ``count`` consecutive elements from a buffer view's start."""
    return tir.Ramp(view.flat_index((0,) * len(view.shape)), te.const(1, "int32"), count)


def _vector(view, count: int):
    return tir.Load(view.data, _lanes(view, count))


_VNNI = _quad_dot_intrinsic("llvm.x86.avx512.vpdpbusd.512")


QCONV2D_PACKED = Strategy(
    "int8_channels", "qnn.conv2d", applies=lambda tiles, node: is_packed(node),
    define_knobs=_define_packed_knobs, schedule=schedule_packed,
    reference=_reference(quant.np_qconv2d))
QDEPTHWISE = Strategy(
    "int8_depthwise", "qnn.conv2d",
    applies=lambda tiles, node: not is_packed(node) and is_depthwise(node),
    define_knobs=define_depthwise_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: schedule_depthwise(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qconv2d))
QCONV2D = Strategy(
    "int8_direct", "qnn.conv2d", applies=lambda tiles, node: not is_packed(node),
    define_knobs=define_direct_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: schedule_direct(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qconv2d))
def _define_packed_dense_knobs(cfg, tiles: Tiles, node, padded: bool):
    """``tile_m`` rows x ``tile_b`` blocks of 16 outputs in registers: by default the most
    accumulators within the vector registers less 4, more blocks first (64x1024x256 on one
    emeraldrapids core: 6 x 4 and 8 x 2 42 us, 4 x 2 64 us, 2 x 4 62 us)."""
    rows, columns = node.shape[-2:]
    blocks = -(-columns // quant.BLOCK_O)
    per_vector = -(-quant.BLOCK_O // max(tiles.lanes, 1))
    fits = sorted(((m * b, b, m) for m in (1, 2, 4, 6, 8) for b in (1, 2, 4)
                   if m <= rows and b <= blocks and m * b * per_vector <= tiles.registers - 4),
                  reverse=True)
    _, b, m = fits[0] if fits else (1, 1, 1)
    cfg.define_knob("tile_m", [m] + [v for v in (1, 2, 4, 6, 8) if v != m and v <= rows])
    cfg.define_knob("tile_b", [b] + [v for v in (1, 2, 4) if v != b and v <= blocks])
    cfg.define_knob("pad", ["stage"])


def schedule_packed_dense(s, anchor, out, tiles: Tiles, cfg, node):
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
    _quad_loops(s[acc], (rq,), (ci, cb), cv, ri, tiles)
    schedule_inputs(s, tiles)


def _quad_loops(stage, reduction, tile, vector, quad, tiles: Tiles):
    """The accumulation's loops: the reduction outside, the register tile unrolled, then a
    block's 16 outputs x a quad's 4 bytes as one dot-product instruction (``vpdpbusd``) or,
    without one, the quad unrolled over vectors of the 16 outputs."""
    for axis in tile:
        stage.unroll(axis)
    if tiles.int8_dot == "avx512_vnni":
        stage.reorder(*reduction, *tile, vector, quad)
        stage.tensorize(vector, _VNNI)
    else:
        stage.reorder(*reduction, *tile, quad, vector)
        stage.unroll(quad)
        stage.vectorize(vector)


QDENSE_PACKED = Strategy(
    "int8_tile", "qnn.dense", applies=lambda tiles, node: is_packed(node),
    define_knobs=_define_packed_dense_knobs, schedule=schedule_packed_dense,
    reference=_reference(quant.np_qdense))
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
INT8 = {"qnn.conv2d": (QCONV2D_PACKED, QDEPTHWISE, QCONV2D), "qnn.dense": (QDENSE_PACKED, QDENSE),
        "qnn.column_reduce": (COLUMN_REDUCE,)}
