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
    """The target's instruction that sums four byte products into each int32 lane of a
    vector: ``"avx512_vnni"`` (``vpdpbusd`` on 512 bits, uint8 x int8) or ``""``. Asked of
    LLVM as the vector width is: a 512-bit multiply-add of int16 pairs into int32 compiles to
    ``vpdpwssd`` where the target has AVX512-VNNI (a generic pattern, which no target
    refuses; the intrinsic itself would abort LLVM on a target without it)."""
    if target.arch != "x86_64" or vector_isa(target).lanes != 16:
        return ""
    return "avx512_vnni" if re.search(r"\bvpdpwssd\b.*%zmm", _vnni_assembly(
        target.llvm_triple, target.cpu, target.features)) else ""


@functools.lru_cache(maxsize=64)
def _vnni_assembly(triple: str, cpu: str, features: str) -> str:
    even = ", ".join(f"i32 {2 * k}" for k in range(16))
    odd = ", ".join(f"i32 {2 * k + 1}" for k in range(16))
    lines = ["define <16 x i32> @probe(<16 x i32> %acc, <32 x i16> %a, <32 x i16> %b) {"]
    for name, mask in (("e", even), ("o", odd)):
        for x in ("a", "b"):
            lines += [f"  %{x}{name}16 = shufflevector <32 x i16> %{x}, <32 x i16> poison, "
                      f"<16 x i32> <{mask}>",
                      f"  %{x}{name} = sext <16 x i16> %{x}{name}16 to <16 x i32>"]
        lines.append(f"  %p{name} = mul <16 x i32> %a{name}, %b{name}")
    lines += ["  %s = add <16 x i32> %pe, %po", "  %r = add <16 x i32> %acc, %s",
              "  ret <16 x i32> %r", "}"]
    return _emit(triple, cpu, features, "\n".join(lines) + "\n")


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
