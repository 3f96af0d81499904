"""The register tiles of the default schedules for one target, from its vector unit."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .vector_isa import int8_dot, vector_isa


@dataclass(frozen=True)
class Tiles:
    """Register tiles of the default schedules for one target: a convolution keeps
    ``conv_channels`` output channels x ``conv_columns`` output columns (whole vectors) in
    registers over its reduction; a dense layer vectors of ``dense_lanes`` outputs;
    ``registers`` vector registers bound the tiles of a convolution's ``channels`` layout;
    ``int8_dot`` the instruction summing four byte products per int32 lane
    (:func:`kernelrpc.compiler.vector_isa.int8_dot`), "" for none."""

    lanes: int
    conv_channels: int
    conv_columns: int
    dense_lanes: int
    registers: int
    int8_dot: str = ""


def tiles_for(target) -> Tiles:
    """Tiles from the target's vector unit (see :func:`_vector_tiles`), with its int8 dot
    product instruction."""
    return replace(_vector_tiles(target), int8_dot=int8_dot(target))


def _vector_tiles(target) -> Tiles:
    """Tiles from the target's vector unit (:func:`kernelrpc.compiler.vector_isa.vector_isa`:
    float32 lanes, how many registers), never from the host's.
    Measurements: docs/performance.md, "Why the defaults are what they are"."""
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
