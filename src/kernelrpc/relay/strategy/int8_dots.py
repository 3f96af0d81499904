"""The instructions of the packed int8 layers, one record per target family: how a quad of
input bytes (uint8, the same for a block's 16 outputs) times the block's 16 x 4 weights (int8)
is added to the block's 16 int32 accumulators, the step of the packed convolution's and dense
layer's reduction (:mod:`kernelrpc.relay.op.quant`, ``OIHW16o4i`` and ``NK16n4k``). The first
record whose target family and weights allow it is taken:

- ``vpdpbusd``: x86 with AVX512-VNNI, one instruction a step;
- ``vpmaddubsw``: x86 with AVX2 or AVX512BW, ``vpmaddubsw`` then ``vpmaddwd`` with ones, where
  the weights cannot saturate its int16 pair sums (below);
- ``vpmaddubsw_halves``: the same targets' other layers, each weight split in halves
  ``w = 2h + l`` that cannot saturate it, twice the instructions;
- ``sdot``: aarch64 with the dot product (ARMv8.2: Cortex-A55/A76 and later);
- ``smull``: aarch64 without it (Cortex-A53/A72), int8 products in int16 summed by ``addp``
  and ``sadalp``, where no weight is -128;
- ``vmlal``: 32-bit Arm with NEON (armv7), ``vmull.s8`` and ``vmlal.s8`` (two int8 products
  of an output in an int16 lane) then ``vpadal.s16``, where no weight is -128;
- ``vectors``: the quad unrolled over vectors of the 16 outputs (SSE, 32-bit Arm without
  NEON, RISC-V, and the weights the records above refuse), as LLVM widens it for the target.

Every record computes the exact int32 sum, as onnxruntime does on a VNNI, AMX or Arm host;
none saturates. ``vpmaddubsw`` adds a pair of uint8 x int8 products in int16 with saturation
(what onnxruntime's AVX2 and AVX-512 kernels compute without VNNI, and why
``quantize_static`` has ``reduce_range``): its record applies only where no pair of a
layer's weights can leave int16 for any input, ``255 * (sum of the pair's positive weights)
<= 32767`` and likewise for the negative ones (``reduce_range``'s 7-bit weights always;
of weights quantized over the full int8 range about one pair in 70 could, so nearly every
such layer takes the halves). The Arm records take int8 by int8 products, so they
multiply the quad shifted by 128 and start the accumulators from 128 times the block's
weight sums.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ... import te
from ...compiler import expr as E
from ...compiler import ir as tir
from ...compiler.ir_builder import create as ir_builder
from ...compiler.tiles import Tiles
from ..op import quant


@dataclass(frozen=True)
class QuadDot:
    """``name``; ``isa``: the :func:`~kernelrpc.compiler.vector_isa.int8_dot` answers of the
    targets that have it (empty: every target); ``fits(weight)``: the packed weight's values
    let it compute the exact sum (None: any weight does); ``intrinsic(tiles, node)(pixels)``:
    the tensor intrinsic of one block step, 16 channels of a pixel or 16 pixels of a channel
    (None: the quad unrolled over vectors of the 16 outputs, which LLVM widens as the target
    allows); ``registers(tiles)``: the vector
    registers of a block's accumulators and of its weights, and those a step holds besides
    (the quad, constants), which bound the register tile."""

    name: str
    isa: tuple[str, ...]
    intrinsic: Callable | None
    registers: Callable
    fits: Callable | None = None

    def applies(self, tiles: Tiles, node) -> bool:
        if self.isa and tiles.int8_dot not in self.isa:
            return False
        if self.fits is None:
            return True
        weight = node.inputs[1]
        if weight.value is None:
            return False
        known = _FITS.setdefault(weight, {})
        if self.name not in known:
            known[self.name] = bool(self.fits(weight.value))
        return known[self.name]


#: each constant weight's answers to the records' ``fits``, by record name: a build asks
#: several times a layer (the strategy table, the schedule, the layer's workload), and a
#: fit reads the whole weight (ResNet-18's int8 build: 81 reads, 0.78 of 9.9 s profiled)
_FITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _declare(name: str, step, reset, pixels: bool):
    """The intrinsic of one block step, ``step(ins, outs, first)`` its statement (``first``:
    the accumulators start from the step's products), ``reset(ins, outs)`` the accumulators'
    start, stored once before the reduction (then every step accumulates, and LLVM keeps the
    accumulators in registers across the reduction's loops). Its 16 outputs are 16 channels
    of a pixel (a quad of input bytes times 16 x 4 weights), or with ``pixels`` 16 pixels of
    a channel (16 quads of input bytes times the channel's 4 weights)."""
    k = te.reduce_axis((0, quant.BLOCK_I), "k")
    if pixels:
        data = te.placeholder((quant.BLOCK_O, quant.BLOCK_I), name="quads", dtype="uint8")
        weight = te.placeholder((quant.BLOCK_I,), name="weight", dtype="int8")
        dot = te.compute((quant.BLOCK_O,), lambda v: te.sum(
            E.cast(data[v, k], "int32") * E.cast(weight[k], "int32"), axis=k), name="quad_dot")
    else:
        quad = te.placeholder((quant.BLOCK_I,), name="quad", dtype="uint8")
        weight = te.placeholder((quant.BLOCK_O, quant.BLOCK_I), name="weight", dtype="int8")
        dot = te.compute((quant.BLOCK_O,), lambda v: te.sum(
            E.cast(quad[k], "int32") * E.cast(weight[v, k], "int32"), axis=k), name="quad_dot")
    return te.decl_tensor_intrin(dot.op, lambda ins, outs: (
        step(ins, outs, True), reset(ins, outs), step(ins, outs, False)),
        name=f"{name}_pixels" if pixels else name)


def _lanes(view, start: tuple, count: int):
    """The flat indices of ``count`` consecutive elements of a buffer view from ``start``."""
    return tir.Ramp(view.flat_index(start), te.const(1, "int32"), count)


def _load(view, start: tuple, count: int):
    return tir.Load(view.data, _lanes(view, start, count))


def _words(view, count: int):
    """A view's first 4 bytes repeated ``count`` times, as ``count * 4`` int8 lanes."""
    word = E.reinterpret("int32", _load(view, (0,), quant.BLOCK_I))
    return E.reinterpret(f"int8x{4 * count}", tir.Broadcast(word, count))


def _operands(ins, pixels: bool):
    """The two sides of a step's products for ``count`` of its outputs from output ``first``,
    each ``4 * count`` bytes: ``data(first, count)`` the uint8 input's, ``weights(first,
    count)`` the int8 weight's, both typed int8 (as the instructions take them, and so that
    a record widening the input shifted by 128 extends its sign). Of 16 channels of a pixel,
    the quad repeated and each channel's 4 weights; of 16 pixels of a channel, each pixel's
    quad and the 4 weights repeated."""
    if pixels:
        return (lambda first, count: E.reinterpret(f"int8x{4 * count}",
                                                   _load(ins[0], (first, 0), 4 * count)),
                lambda first, count: _words(ins[1], count))
    return (lambda first, count: _words(ins[0], count),
            lambda first, count: _load(ins[1], (first, 0), 4 * count))


def _chunks(name: str, step_chunk, width: int, start=None):
    """``make(pixels)``: the intrinsic of a block step, of channels or of pixels, as
    ``64 / width`` chunks of ``width`` bytes of each side (``width / 4`` outputs):
    ``step_chunk(acc, data, weights, first)`` is the chunk's accumulators after the step
    (:func:`_operands`' sides), from ``acc``: their values, or at the start ``start(ins,
    first, lanes, pixels)`` (zeros)."""
    lanes = width // quant.BLOCK_I

    def make(pixels: bool):
        def begin(ins, first):
            if start is None:
                return tir.Broadcast(te.const(0, "int32"), lanes)
            return start(ins, first, lanes, pixels)

        def stores(outs, chunk_value):
            ib = ir_builder()
            for first in range(0, quant.BLOCK_O, lanes):
                ib.emit(tir.Store(outs[0].data, chunk_value(first),
                                  _lanes(outs[0], (first,), lanes)))
            return ib.get()

        def step(ins, outs, first_step):
            data, weights = _operands(ins, pixels)
            return stores(outs, lambda first: step_chunk(
                begin(ins, first) if first_step else _load(outs[0], (first,), lanes), data,
                weights, first))
        return _declare(name, step, lambda ins, outs: stores(
            outs, lambda first: begin(ins, first)), pixels)
    return make


def _vnni(tiles, node):
    """``vpdpbusd``: the 16 accumulators += the dot products of their 4 input bytes and 4
    weights."""
    def chunk(acc, data, weights, first):
        return E.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc,
                                       data(0, 16), weights(0, 16))
    return _chunks("vpdpbusd", chunk, 64)


#: ``vpmaddubsw`` and ``vpmaddwd`` of 256 and 512 bits
_PAIRS = {32: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
          64: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512")}


def _pairs(tiles, node):
    """``vpmaddubsw`` (each pair of an output's input bytes times its pair of weights, summed
    in int16), then ``vpmaddwd`` with ones (the two pairs of a quad summed in int32), on 512
    bits where the target has AVX512BW, else on 256 (two chunks of 8 outputs)."""
    width = 64 if tiles.int8_dot == "avx512bw" else 32
    bytes_pairs, words = _PAIRS[width]
    ones = tir.Broadcast(te.const(1, "int16"), width // 2)

    def chunk(acc, data, weights, first):
        count = width // 4
        pairs = E.call_llvm_pure_intrin(f"int16x{width // 2}", bytes_pairs, data(first, count),
                                        weights(first, count))
        return acc + E.call_llvm_pure_intrin(f"int32x{width // 4}", words, pairs, ones)
    return _chunks("vpmaddubsw", chunk, width)


def _halves(tiles, node):
    """``vpmaddubsw`` on weights of the full int8 range, exact: each weight ``w = 2h + l``
    (``h = floor(w / 2)`` in [-64, 63], ``l`` 0 or 1, taken from the loaded weights once a
    step), two ``vpmaddubsw`` (255 x 128 x 2 = 32640 at most: neither saturates) and two
    ``vpmaddwd``, with twos and with ones."""
    width = 64 if tiles.int8_dot == "avx512bw" else 32
    bytes_pairs, words = _PAIRS[width]

    def constant(value):
        return tir.Broadcast(te.const(value, "int16"), width // 2)

    def chunk(acc, data, weights, first):
        count = width // 4
        quad, weight = data(first, count), weights(first, count)
        high = E.floordiv(weight, tir.Broadcast(te.const(2, "int8"), width))
        low = weight - high - high
        for part, factor in ((high, 2), (low, 1)):
            pairs = E.call_llvm_pure_intrin(f"int16x{width // 2}", bytes_pairs, quad, part)
            acc = acc + E.call_llvm_pure_intrin(f"int32x{width // 4}", words, pairs,
                                                constant(factor))
        return acc
    return _chunks("vpmaddubsw_halves", chunk, width)


def pairs_fit(weight: np.ndarray) -> bool:
    """No pair of the packed weight's quads can take ``vpmaddubsw``'s int16 sum out of range
    for any uint8 input: ``255 * (p0 + p1) <= 32767`` for the pair's positive weights, and the
    same bound on the negative ones."""
    pairs = quant.packed_quads(weight).reshape(-1, 2).astype(np.int32)
    return bool((np.maximum(pairs, 0).sum(axis=1) <= 128).all() and
                (np.minimum(pairs, 0).sum(axis=1) >= -128).all())


def _sums_start(node):
    """The accumulators' start for a record that multiplies the input shifted by 128: 128
    times their channels' weight sums (:func:`kernelrpc.relay.op.quant.weight_sums`, in the
    block's last quad, read where the weight's view is at the block's start: before the
    reduction; of 16 pixels, their channel's one sum), so that they end at ``sum x * w`` as
    the declared computation says."""
    shape = node.inputs[1].shape
    sums_at = (shape[1] - 1) * int(np.prod(shape[2:]))    # the last quad, from the first

    def start(ins, first, lanes, pixels):
        at = ins[1].flat_index((0,) if pixels else (first, 0)) + sums_at
        count = 1 if pixels else lanes
        sums = E.reinterpret(f"int32x{count}" if count > 1 else "int32", tir.Load(
            ins[1].data, tir.Ramp(at, te.const(1, "int32"), count * quant.BLOCK_I)))
        if pixels:
            sums = tir.Broadcast(sums, lanes)
        return sums * tir.Broadcast(te.const(128, "int32"), lanes)
    return start


def _shifted(data, first, count):
    """The input bytes of ``count`` outputs less 128 (their top bit flipped), as int8."""
    return data(first, count) + tir.Broadcast(te.const(-128, "int8"), 4 * count)


def _sdot(tiles, node):
    """aarch64's ``sdot`` (int8 x int8) on the input shifted by 128, four chunks of 4
    outputs, from :func:`_sums_start`."""
    def chunk(acc, data, weights, first):
        return E.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.sdot.v4i32.v16i8", acc,
                                       _shifted(data, first, 4), weights(first, 4))
    return _chunks("sdot", chunk, 16, _sums_start(node))


def sums_fit(weight: np.ndarray) -> bool:
    """The accumulators of a record that starts from 128 times the weight sums stay in int32:
    for every output, 256 times the sum of its weights' magnitudes is below 2**31."""
    quads = np.abs(quant.packed_quads(weight).astype(np.int64))
    magnitudes = quads.sum(axis=(*range(1, quads.ndim - 2), quads.ndim - 1))
    return bool(magnitudes.max(initial=0) < 2 ** 23)


def _widening(tiles, node):
    """aarch64 without the dot product: per 4 outputs, ``smull`` and ``smull2`` (the input
    shifted by 128, as for ``sdot``, times the weights: int8 products in int16), ``addp`` (a
    quad's products summed in pairs, in int16: no weight is -128, so a pair stays within
    2 x 128 x 127) and ``sadalp`` (the two pairs added to the int32 accumulators), which
    start from 128 times the weight sums."""
    def chunk(acc, data, weights, first):
        halves = [E.cast(weights(first + c, 2), "int16x8") *
                  E.cast(_shifted(data, first + c, 2), "int16x8") for c in (0, 2)]
        pairs = E.call_llvm_pure_intrin("int16x8", "llvm.aarch64.neon.addp.v8i16", *halves)
        return acc + E.call_llvm_pure_intrin("int32x4", "llvm.aarch64.neon.saddlp.v4i32.v8i16",
                                             pairs)
    return _chunks("smull", chunk, 16, _sums_start(node))


def no_minimum_weight(weight: np.ndarray) -> bool:
    """No weight is -128 (whose products with -128 would leave int16 in pairs), and the sums
    fit (:func:`sums_fit`)."""
    return bool((quant.packed_quads(weight) != -128).all()) and sums_fit(weight)


def _vmlal(tiles, node):
    """32-bit Arm with NEON (ARMv7-A: Cortex-A7, A9, A15; ARMv8 in AArch32), per 4 outputs:
    their 16 weights read as 8 int16 lanes, whose low bytes (``vmovn``) are each quad's bytes
    0 and 2 and whose high bytes (``vshrn``) its bytes 1 and 3, likewise the input shifted by
    128 (as for ``sdot``); ``vmull.s8`` of the low bytes, ``vmlal.s8`` of the high ones (an
    int16 lane holds two products of one output: no weight is -128, so it stays within
    2 x 128 x 127) and ``vpadal.s16`` (an output's two lanes added to its int32
    accumulator), from :func:`_sums_start`."""
    def chunk(acc, data, weights, first):
        quad = E.reinterpret("int16x8", _shifted(data, first, 4))
        weight = E.reinterpret("int16x8", weights(first, 4))
        byte = tir.Broadcast(te.const(256, "int16"), 8)
        products = [E.call_llvm_pure_intrin("int16x8", "llvm.arm.neon.vmulls.v8i16",
                                            E.cast(half(weight), "int8x8"),
                                            E.cast(half(quad), "int8x8"))
                    for half in (lambda v: v, lambda v: E.floordiv(v, byte))]
        pairs = products[0] + products[1]
        return E.call_llvm_pure_intrin("int32x4", "llvm.arm.neon.vpadals.v4i32.v8i16", acc,
                                       pairs)
    return _chunks("vmlal", chunk, 16, _sums_start(node))


def _vector_registers(tiles: Tiles) -> tuple[int, int, int]:
    return -(-quant.BLOCK_O // max(tiles.lanes, 1)), 0, 4


VNNI = QuadDot("vpdpbusd", ("avx512_vnni",), _vnni, registers=lambda tiles: (1, 1, 3))
PAIRS = QuadDot("vpmaddubsw", ("avx512bw", "avx2"), _pairs, fits=pairs_fit,
                registers=lambda tiles: (1, 1, 4) if tiles.int8_dot == "avx512bw" else (2, 2, 4))
HALVES = QuadDot("vpmaddubsw_halves", ("avx512bw", "avx2"), _halves,
                 registers=lambda tiles: (1, 2, 4) if tiles.int8_dot == "avx512bw" else (2, 4, 4))
SDOT = QuadDot("sdot", ("dotprod",), _sdot, fits=sums_fit, registers=lambda tiles: (4, 4, 2))
WIDENING = QuadDot("smull", ("asimd",), _widening, fits=no_minimum_weight,
                   registers=lambda tiles: (4, 4, 4))
#: of armv7's 16 q registers, the quad's halves, the 0x80 of its shift and two products take
#: 4 besides a block's 4 accumulators and 4 of narrowed weights, but LLVM spills a tile of two
#: columns (12 accumulators and weights) on every step: one more keeps the tile to one column
VMLAL = QuadDot("vmlal", ("neon",), _vmlal, fits=no_minimum_weight,
                registers=lambda tiles: (4, 4, 5))
VECTORS = QuadDot("vectors", (), None, registers=_vector_registers)

#: the records in the order tried: the first whose target family and weights allow it
QUAD_DOTS = (VNNI, PAIRS, HALVES, SDOT, WIDENING, VMLAL, VECTORS)
