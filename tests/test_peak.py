"""One core's multiply-add peak, measured for the target built for."""
import re

import pytest

from kernelrpc.compiler import peak
from kernelrpc.compiler.target import Target
from target_families import FAMILIES, runs_here


@pytest.mark.parametrize("family", ["avx2", "sse"])
def test_the_peak_of_a_family_the_host_runs(family):
    target = Target(FAMILIES[family])
    if not runs_here(target):
        pytest.skip(f"this host cannot run {family} code")
    assert peak.fma_peak_gflops(target, seconds=0.02) > 0


def test_the_kernel_is_one_multiply_add_per_register_a_step():
    """Every accumulator a loop-carried chain of its own: LLVM can hoist nothing, and AVX2
    code is one vfmadd per ymm accumulator, 14 of its 16 registers."""
    import llvmlite.binding as llvm

    from kernelrpc.native.llvm import ensure_llvm

    ensure_llvm()
    target = Target(FAMILIES["avx2"])
    module = llvm.parse_assembly(peak._kernel_ir(8, 14))
    machine = llvm.Target.from_triple(target.llvm_triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=2)
    assembly = machine.emit_assembly(module)
    loop = assembly[assembly.index(".LBB0_1:"):]
    loop = loop[:loop.index("jb")]
    assert len(re.findall(r"vfmadd\w+\s+%ymm", loop)) == 14
    assert not re.search(r"\(%r", loop)           # no memory operand in the loop


def test_a_target_that_does_not_run_here_is_refused():
    with pytest.raises(ValueError, match="does not run here"):
        peak.fma_peak_gflops("llvm -mtriple=aarch64-linux-gnu")
