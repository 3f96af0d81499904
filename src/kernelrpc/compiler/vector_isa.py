"""What a target's vector unit is: float32 lanes of a register, how many registers, FMA.

Read from the target built for, never from the host: ``llvm -mcpu=haswell`` is 8 lanes on
any machine, and ``llvm`` (the host) is whatever this CPU is. On x86 the answer is LLVM's
own: a ``<16 x float>`` fused multiply-add is compiled for the target's CPU and features and
the registers of its assembly tell the width (zmm, ymm, xmm, or none: x87), so every CPU name
LLVM knows, and every ``-mattr`` that turns a feature off, gets its real width without a
table of CPU names to keep up to date. Arm and RISC-V follow from the triple and features.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..native.llvm import ensure_llvm

__all__ = ["VectorISA", "int8_dot", "vector_isa"]


@dataclass(frozen=True)
class VectorISA:
    """``name``: ``avx512``, ``avx2``, ``avx``, ``sse``, ``neon`` (aarch64's Advanced SIMD
    and 32-bit Arm's NEON) or ``scalar``; ``lanes``: float32 lanes of one vector register
    (1 when scalar); ``registers``: the vector (or floating-point) registers a kernel's tile
    may use; ``fma``: a fused multiply-add instruction exists."""

    name: str
    lanes: int
    registers: int
    fma: bool

    @property
    def flops_per_instruction(self) -> int:
        """Floating-point operations of one multiply-add instruction (2 per lane with FMA)."""
        return self.lanes * (2 if self.fma else 1)


_X86 = {"zmm": VectorISA("avx512", 16, 32, True),
        "ymm": VectorISA("avx2", 8, 16, True),
        "xmm": VectorISA("sse", 4, 16, False)}


def vector_isa(target) -> VectorISA:
    """The vector unit of ``target`` (a :class:`~kernelrpc.compiler.target.Target`)."""
    return _isa(target.arch, target.llvm_triple, target.cpu, target.features)


@functools.lru_cache(maxsize=64)
def _isa(arch: str, triple: str, cpu: str, features: str) -> VectorISA:
    enabled = set(features.split(",")) if features else set()
    if arch in ("x86_64", "i386", "i686"):
        return _x86_isa(triple, cpu, features)
    if arch == "aarch64":
        return VectorISA("neon", 4, 32, True)
    if arch.startswith(("arm", "thumb")):
        if "+neon" in enabled:
            return VectorISA("neon", 4, 16, "+vfp4" in enabled or "+fp-armv8" in enabled)
        return VectorISA("scalar", 1, 16, "+vfp4" in enabled)
    return VectorISA("scalar", 1, 32, "+f" in enabled or "+d" in enabled)


def _x86_isa(triple: str, cpu: str, features: str) -> VectorISA:
    """The registers of a ``<16 x float>`` ``llvm.fmuladd`` tell the width, its instruction
    FMA (it is fused only where the target has FMA, and never a library call)."""
    assembly = _assembly(triple, cpu, features)
    fma = bool(re.search(r"\bvfmadd", assembly))
    for register in ("zmm", "ymm", "xmm"):
        if re.search(rf"%{register}\d", assembly):
            if register == "ymm" and not fma:
                return VectorISA("avx", 8, 16, False)
            return _X86[register]
    return VectorISA("scalar", 1, 8, False)


def int8_dot(target) -> str:
    """The target's instructions that sum byte products into int32 lanes, asked of LLVM for
    the target as the vector width is (a generic pattern that no target refuses, compiled for
    it: the intrinsics themselves would abort LLVM on a target without them):

    - ``"avx512_vnni"``: ``vpdpbusd`` on 512 bits (uint8 x int8, four products a lane), where
      a multiply-add of int16 pairs into int32 compiles to ``vpdpwssd``;
    - ``"avx512bw"``, ``"avx2"``: ``vpmaddubsw`` (uint8 x int8 pairs summed into int16, which
      saturates) then ``vpmaddwd``, on 512 or 256 bits, where a saturated sum of such pairs
      compiles to ``vpmaddubsw`` on zmm or ymm registers;
    - ``"dotprod"``: aarch64's ``sdot`` (int8 x int8, four products a lane), where the sum of
      sixteen int8 products compiles to it;
    - ``"asimd"``: aarch64 without the dot product (Advanced SIMD's widening multiplies,
      ``smull``, and pairwise additions, ``addp`` and ``sadalp``);
    - ``"neon"``: 32-bit Arm with NEON (its widening multiplies, ``vmull.s8`` and
      ``vmlal.s8``, and ``vpadal.s16``), where :func:`vector_isa` finds NEON;
    - ``""``: none of these (SSE, AVX without AVX2, 32-bit Arm without NEON, RISC-V)."""
    probe = functools.partial(_probe, target.llvm_triple, target.cpu, target.features)
    if target.arch == "aarch64":
        return "dotprod" if re.search(r"\bsdot\b", probe("sdot")) else "asimd"
    if target.arch.startswith(("arm", "thumb")):
        return "neon" if vector_isa(target).name == "neon" else ""
    if target.arch != "x86_64":
        return ""
    if vector_isa(target).lanes == 16 and re.search(r"\bvpdpwssd\b.*%zmm", probe("vnni")):
        return "avx512_vnni"
    for name, register in (("avx512bw", "zmm"), ("avx2", "ymm")):
        if re.search(rf"\bvpmaddubsw\b.*%{register}", probe(name)):
            return name
    return ""


def masked_load_bits(target) -> frozenset:
    """The element widths (bits) of which the target loads a vector under a mask in one
    instruction: AVX-512's ``vmovups``/``vmovdqu8`` with a mask register (bytes and words
    with AVX512BW), AVX's ``vmaskmovps``/``vmaskmovpd``; none elsewhere (LLVM loads such a
    vector lane by lane, a branch a lane)."""
    isa = vector_isa(target)
    if isa.name == "avx512":
        wide = frozenset({32, 64})
        return wide | {8, 16} if int8_dot(target) in ("avx512_vnni", "avx512bw") else wide
    if isa.name in ("avx", "avx2"):
        return frozenset({32, 64})
    return frozenset()


@functools.lru_cache(maxsize=256)
def _probe(triple: str, cpu: str, features: str, kind: str) -> str:
    """The assembly of one of the patterns :func:`int8_dot` asks about."""
    if kind == "vnni":
        text = _pairs_probe("i16", "sext", "sext", 16, saturate=False)
    elif kind == "sdot":
        text = ("define i32 @probe(<16 x i8> %a, <16 x i8> %b) {\n"
                "  %x = sext <16 x i8> %a to <16 x i32>\n  %y = sext <16 x i8> %b to <16 x i32>\n"
                "  %m = mul <16 x i32> %x, %y\n"
                "  %r = call i32 @llvm.vector.reduce.add.v16i32(<16 x i32> %m)\n  ret i32 %r\n}\n"
                "declare i32 @llvm.vector.reduce.add.v16i32(<16 x i32>)\n")
    else:
        text = _pairs_probe("i8", "zext", "sext", 32 if kind == "avx512bw" else 16, saturate=True)
    return _emit(triple, cpu, features, text)


def _pairs_probe(narrow: str, extend_a: str, extend_b: str, lanes: int, saturate: bool) -> str:
    """``a[2k] * b[2k] + a[2k+1] * b[2k+1]`` over ``lanes`` lanes of ``narrow`` pairs: added
    to int32 accumulators (``vpdpwssd``'s pattern), or saturated to int16 (``vpmaddubsw``'s)."""
    pairs, wide = f"<{2 * lanes} x {narrow}>", f"<{lanes} x i32>"
    result = f"<{lanes} x i16>" if saturate else wide
    lines = [f"define {result} @probe({wide} %acc, {pairs} %a, {pairs} %b) {{"]
    for name, first in (("e", 0), ("o", 1)):
        mask = ", ".join(f"i32 {2 * k + first}" for k in range(lanes))
        for x, extend in (("a", extend_a), ("b", extend_b)):
            lines += [(f"  %{x}{name}n = shufflevector {pairs} %{x}, {pairs} poison, "
                       f"<{lanes} x i32> <{mask}>"),
                      f"  %{x}{name} = {extend} <{lanes} x {narrow}> %{x}{name}n to {wide}"]
        lines.append(f"  %p{name} = mul {wide} %a{name}, %b{name}")
    lines.append(f"  %s = add {wide} %pe, %po")
    if saturate:
        bound = "({wide} %{x}, {wide} splat (i32 {v}))"
        lines += [f"  %lo = call {wide} @llvm.smax.v{lanes}i32" +
                  bound.format(wide=wide, x="s", v=-32768),
                  f"  %hi = call {wide} @llvm.smin.v{lanes}i32" +
                  bound.format(wide=wide, x="lo", v=32767),
                  f"  %r = trunc {wide} %hi to {result}", f"  ret {result} %r", "}"]
        lines += [f"declare {wide} @llvm.{op}.v{lanes}i32({wide}, {wide})"
                  for op in ("smax", "smin")]
    else:
        lines += [f"  %r = add {wide} %acc, %s", f"  ret {wide} %r", "}"]
    return "\n".join(lines) + "\n"


def _assembly(triple: str, cpu: str, features: str) -> str:
    vector = "<16 x float>"
    return _emit(triple, cpu, features,
                 f"declare {vector} @llvm.fmuladd.v16f32({vector}, {vector}, {vector})\n"
                 "define void @probe(ptr %a, ptr %b, ptr %c) {\n"
                 f"  %x = load {vector}, ptr %a\n  %y = load {vector}, ptr %b\n"
                 f"  %z = load {vector}, ptr %c\n"
                 f"  %r = call {vector} @llvm.fmuladd.v16f32({vector} %x, {vector} %y, "
                 f"{vector} %z)\n  store {vector} %r, ptr %c\n  ret void\n}}\n")


def _emit(triple: str, cpu: str, features: str, text: str) -> str:
    llvm = ensure_llvm()
    machine = llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=2)
    return machine.emit_assembly(llvm.parse_assembly(text))
