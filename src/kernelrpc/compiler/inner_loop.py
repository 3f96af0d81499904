"""The instruction mix of a kernel's hottest inner loop, read from its assembly.

Under emulation a board's timings mean nothing; what its code does per step still does. For
x86-64, aarch64 and 32-bit Arm assembly (LLVM's), :func:`inner_loops` finds every loop (a
branch back to a label above it, with no other loop inside) and counts its instructions,
its multiply-adds on vectors and its memory reads and writes; :func:`hottest_loop` is the
one with the most vector multiply-adds: the kernel's inner loop.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LoopMix", "hottest_loop", "inner_loops"]

_LABEL = re.compile(r"^([.\w$]+):")


@dataclass(frozen=True)
class _Syntax:
    vector_fma: re.Pattern
    load: re.Pattern
    store: re.Pattern
    branch: re.Pattern     # group 1: the target label
    comment: str


_X86 = _Syntax(
    vector_fma=re.compile(r"^(vf(n?)m(add|sub)\w*p[sd]|v?mulp[sd])\s"),   # SSE: mul + add
    load=re.compile(r"^(?!.*,\s*[^,]*\()[^,]*\("),       # a memory operand, not the last one
    store=re.compile(r",\s*[^,]*\([^,]*\)$|^\w+\s+[^,]*\([^,]*\)$"),
    branch=re.compile(r"^j\w+\s+([.\w$]+)$"), comment="#")
_AARCH64 = _Syntax(
    vector_fma=re.compile(r"^f(n?)ml[as]\s+v\d+\.\d*[sd]\b"),
    load=re.compile(r"^(ld[1-4]r?|ldr|ldp|ldur|ldnp)\s"),
    store=re.compile(r"^(st[1-4]|str|stp|stur|stnp)\s"),
    branch=re.compile(r"^(?:b(?:\.\w+)?|cbn?z\s+\w+,|tbn?z\s+\w+,\s*#\d+,)\s*([.\w$]+)$"),
    comment="//")
_ARM = _Syntax(
    vector_fma=re.compile(r"^v(fma|mla)\.f32\s+q\d+"),
    load=re.compile(r"^(vld[1-4](\.\d+)?|vldr|vldm\w*|ldr\w*|ldm\w*)\s"),
    store=re.compile(r"^(vst[1-4](\.\d+)?|vstr|vstm\w*|str\w*|stm\w*)\s"),
    branch=re.compile(r"^b(?:\w{2})?\s+([.\w$]+)$"), comment="@")


@dataclass(frozen=True)
class LoopMix:
    """One inner loop: ``instructions`` in its body, of which ``vector_fmas`` multiply-adds
    on vectors (on x86 without FMA, the multiplies of multiply-add pairs), ``loads`` and
    ``stores`` touching memory."""

    label: str
    instructions: int
    vector_fmas: int
    loads: int
    stores: int

    @property
    def fma_share(self) -> float:
        """Vector multiply-adds per instruction of the loop."""
        return self.vector_fmas / self.instructions if self.instructions else 0.0

    @property
    def fmas_per_load(self) -> float:
        return self.vector_fmas / self.loads if self.loads else float(self.vector_fmas)


def _syntax(arch: str) -> _Syntax:
    if arch in ("x86_64", "i386", "i686"):
        return _X86
    if arch == "aarch64":
        return _AARCH64
    if arch.startswith(("arm", "thumb")):
        return _ARM
    raise ValueError(f"no instruction patterns for {arch} assembly")


def _lines(assembly: str, comment: str) -> list[tuple[str, str]]:
    """``(kind, text)``: ``"label"`` or ``"insn"`` for each line that is one (comments,
    directives and blank lines dropped)."""
    out = []
    for raw in assembly.splitlines():
        line = raw.split(comment)[0].strip()
        found = _LABEL.match(line)
        if found:
            out.append(("label", found.group(1)))
        elif line and not line.startswith("."):
            out.append(("insn", re.sub(r"\s+", " ", line)))
    return out


def inner_loops(assembly: str, arch: str) -> list[LoopMix]:
    """Every innermost loop of the assembly of one target (``arch``: the triple's first part)."""
    syntax = _syntax(arch)
    lines = _lines(assembly, syntax.comment)
    labels = {text: k for k, (kind, text) in enumerate(lines) if kind == "label"}
    loops = []
    for end, (kind, text) in enumerate(lines):
        if kind != "insn":
            continue
        branch = syntax.branch.match(text)
        if not branch or branch.group(1) not in labels or labels[branch.group(1)] >= end:
            continue
        start = labels[branch.group(1)]
        loops.append((start, end, branch.group(1)))
    innermost = [loop for loop in loops
                 if not any(other is not loop and loop[0] <= other[0] and other[1] <= loop[1]
                            for other in loops)]
    out = []
    for start, end, label in innermost:
        body = [text for kind, text in lines[start + 1:end + 1] if kind == "insn"]
        out.append(LoopMix(label, len(body),
                           sum(1 for t in body if syntax.vector_fma.match(t)),
                           sum(1 for t in body if syntax.load.search(t) and
                               not syntax.store.search(t)),
                           sum(1 for t in body if syntax.store.search(t))))
    return out


def hottest_loop(assembly: str, arch: str) -> LoopMix | None:
    """The inner loop with the most vector multiply-adds (None: no loop has one)."""
    loops = [loop for loop in inner_loops(assembly, arch) if loop.vector_fmas]
    return max(loops, key=lambda loop: (loop.vector_fmas, -loop.instructions)) if loops else None
