"""A target's vector unit comes from the target built for, never from the host."""
import pytest

from kernelrpc.compiler.target import Target, TargetError
from kernelrpc.compiler.vector_isa import vector_isa
from kernelrpc.relay import strategy


@pytest.mark.parametrize("spec, name, lanes, registers, fma", [
    ("llvm -mcpu=skylake-avx512", "avx512", 16, 32, True),
    ("llvm -mcpu=znver4", "avx512", 16, 32, True),
    ("llvm -mcpu=sapphirerapids -mattr=-avx512f", "avx2", 8, 16, True),
    ("llvm -mcpu=haswell", "avx2", 8, 16, True),
    ("llvm -mcpu=znver3", "avx2", 8, 16, True),
    ("llvm -mcpu=sandybridge", "avx", 8, 16, False),
    ("llvm -mcpu=x86-64", "sse", 4, 16, False),
    ("llvm -mtriple=i686-linux-gnu -mcpu=i686", "scalar", 1, 8, False),
    ("llvm -mtriple=aarch64-linux-gnu", "neon", 4, 32, True),
    ("llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp4", "neon", 4, 16, True),
    ("llvm -mtriple=armv7a-linux-gnueabihf -mattr=+vfp3,+d16,-neon", "scalar", 1, 16, False),
    ("llvm -mtriple=riscv64-linux-gnu", "scalar", 1, 32, True),
])
def test_the_vector_unit_is_the_target_s(spec, name, lanes, registers, fma):
    isa = vector_isa(Target(spec))
    assert (isa.name, isa.lanes, isa.registers, isa.fma) == (name, lanes, registers, fma)
    assert strategy.tiles_for(Target(spec)).lanes == lanes


def test_a_cpu_name_alone_is_not_read_as_the_host():
    """``-mcpu=x86-64`` with no ``-mattr`` is SSE2's 4 lanes on any host (its features are the
    CPU's own, an empty string in the target)."""
    assert Target("llvm -mcpu=x86-64").features == ""
    assert strategy.tiles_for(Target("llvm -mcpu=x86-64")).lanes == 4


def test_x86_64_code_without_sse2_is_refused():
    """Its floats are passed in SSE registers: LLVM would stop the process at the first call of
    a float function of the C library."""
    with pytest.raises(TargetError, match="needs SSE2"):
        Target("llvm -mcpu=x86-64 -mattr=-sse,-sse2")
