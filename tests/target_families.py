"""The vector widths every schedule is checked on, whatever the host: x86 code for a 16-lane
(AVX-512), 8-lane (AVX2) and 4-lane (SSE2) target. Code for a lower family runs on a higher
host; a family the host cannot run (AVX-512 code on an AVX2 host) is skipped, naming why.
The scalar family (x86-64 code cannot do without SSE2: its calling convention needs it) and
the 4-lane Arm families run on the emulated boards (riscv64 and armv7 VFP, aarch64 and armv7
NEON: the cross tests)."""
import pytest

from kernelrpc.compiler.target import Target
from kernelrpc.compiler.vector_isa import vector_isa

FAMILIES = {
    "avx512": "llvm -mcpu=skylake-avx512",
    "avx2": "llvm -mcpu=haswell",
    "sse": "llvm -mcpu=x86-64",
}


def runs_here(target: Target) -> bool:
    """This host can run code built for ``target``: an x86-64 host whose vector unit is at
    least as wide, with FMA where the target uses it."""
    host = Target(None)
    if host.arch != "x86_64" or target.arch != "x86_64":
        return False
    have, need = vector_isa(host), vector_isa(target)
    return have.lanes >= need.lanes and (have.fma or not need.fma)


def family_params():
    """``pytest.param(Target, id=family)`` for each family, skipped where it cannot run."""
    params = []
    for name, spec in FAMILIES.items():
        target = Target(spec)
        reason = f"this host cannot run {name} code ({spec})"
        params.append(pytest.param(target, id=name,
                                   marks=pytest.mark.skipif(not runs_here(target),
                                                            reason=reason)))
    return params
