"""One core's floating-point peak for a target: the figure a kernel's GFLOP/s is a share of.

The kernel is written in LLVM IR by hand, not through the compiler's schedules, so that
nothing in it can be hoisted or folded: as many independent multiply-add chains as the
target's vector registers hold (less two for the operands), each ``acc = acc * x + y`` on the
previous value of its own accumulator (``llvm.fmuladd``: one FMA where the target has FMA, a
multiply and an add where it has not), over the vector width of the target. No memory is
touched inside the loop, and no kernel can do more multiply-adds per cycle than that.
"""
from __future__ import annotations

import ctypes
import time

from ..native.llvm import ensure_llvm
from .codegen.llvm_emit import _target_machine
from .target import Target
from .vector_isa import vector_isa

__all__ = ["fma_peak_gflops"]

#: one timed run of the loop: short enough that many runs see no other process
RUN_SECONDS = 0.002


def _kernel_ir(lanes: int, chains: int) -> str:
    ty = f"<{lanes} x float>" if lanes > 1 else "float"
    suffix = f"v{lanes}f32" if lanes > 1 else "f32"

    def splat(value: str) -> str:
        return f"<{', '.join([f'float {value}'] * lanes)}>" if lanes > 1 else value
    x, y = splat("0x3FEFFFFFE0000000"), splat("0x3FB99999A0000000")   # ~0.99999994, ~0.1
    lines = [f"declare {ty} @llvm.fmuladd.{suffix}({ty}, {ty}, {ty})",
             "define void @peak(i64 %steps, ptr %out) {", "entry:", "  br label %loop", "loop:",
             "  %i = phi i64 [0, %entry], [%next, %loop]"]
    for c in range(chains):
        lines.append(f"  %a{c} = phi {ty} [{splat('1.0')}, %entry], [%b{c}, %loop]")
    for c in range(chains):
        lines.append(f"  %b{c} = call {ty} @llvm.fmuladd.{suffix}({ty} %a{c}, {ty} {x}, "
                     f"{ty} {y})")
    lines += ["  %next = add i64 %i, 1", "  %more = icmp ult i64 %next, %steps",
              "  br i1 %more, label %loop, label %done", "done:"]
    total = "%b0"
    for c in range(1, chains):
        lines.append(f"  %s{c} = fadd {ty} {total}, %b{c}")
        total = f"%s{c}"
    lines.append(f"  %r = extractelement {ty} {total}, i32 0" if lanes > 1 else
                 f"  %r = fadd float {total}, 0.0")
    lines += ["  store float %r, ptr %out", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def fma_peak_gflops(target=None, seconds: float = 0.2) -> float:
    """GFLOP/s (a multiply-add counts 2) of one thread on this host running code built for
    ``target`` (default: the host), over about ``seconds``. The target must run here.

    The fastest of many short runs (about ``RUN_SECONDS`` each): on a shared machine most runs
    of a long one are interrupted, and a peak measured low would let kernels timed in a quiet
    moment pass 100% of it."""
    target = Target(target)
    if not target.is_host:
        raise ValueError(f"fma_peak_gflops measures this host: {target} does not run here")
    isa = vector_isa(target)
    chains = max(isa.registers - 2, 4)
    llvm = ensure_llvm()
    module = llvm.parse_assembly(_kernel_ir(isa.lanes, chains))
    engine = llvm.create_mcjit_compiler(module, _target_machine(target, 2))
    engine.finalize_object()
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(
        engine.get_function_address("peak"))
    sink = ctypes.c_float()

    def peak(steps):
        kernel(steps, ctypes.addressof(sink))
    steps = 1 << 10
    while _timed(peak, steps) <= RUN_SECONDS / 2:
        steps *= 2
    deadline = time.perf_counter() + seconds
    best = _timed(peak, steps)
    while time.perf_counter() < deadline:
        best = min(best, _timed(peak, steps))
    return 2 * isa.lanes * chains * steps / best / 1e9


def _timed(fn, steps: int) -> float:
    start = time.perf_counter()
    fn(steps)
    return time.perf_counter() - start
