"""How to optimize GEMM on CPU, with kernelrpc.te (a port of TVM's classic tutorial).

Each step is a function returning ``(schedule, args)`` for C = A @ B with A (M, K),
B (K, N), C (M, N) in float32. The steps follow the tutorial line by line: baseline,
blocking, vectorization, loop permutation, array packing, block write cache,
parallel; then one step past it, a register-blocked microkernel (a 4x64 tile of
vector accumulators over packed B, parallel over rows) that reaches numpy's BLAS.

Run::

    PYTHONPATH=src python examples/gemm_tutorial.py              # all steps, 1024^3
    PYTHONPATH=src python examples/gemm_tutorial.py --size 512 --steps blocking,register
    PYTHONPATH=src python examples/gemm_tutorial.py --print-ir register --size 256
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import kernelrpc
from kernelrpc import nd, te

BN = 32       # the tutorial's block size
KFACTOR = 4   # the tutorial's reduction split
MR, NR = 4, 64  # register tile: 4 rows x 64 columns = 16 zmm (or 32 ymm) accumulators


def _inputs(M, K, N):
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    return A, B


def _matmul(M, K, N):
    k = te.reduce_axis((0, K), "k")
    A, B = _inputs(M, K, N)
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * B[k, n], axis=k), name="C")
    return A, B, C


def baseline(M, K, N):
    A, B, C = _matmul(M, K, N)
    return te.create_schedule(C.op), [A, B, C]


def blocking(M, K, N):
    A, B, C = _matmul(M, K, N)
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (kaxis,) = s[C].op.reduce_axis
    ko, ki = s[C].split(kaxis, factor=KFACTOR)
    s[C].reorder(mo, no, ko, ki, mi, ni)
    return s, [A, B, C]


def vectorization(M, K, N):
    A, B, C = _matmul(M, K, N)
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (kaxis,) = s[C].op.reduce_axis
    ko, ki = s[C].split(kaxis, factor=KFACTOR)
    s[C].reorder(mo, no, ko, ki, mi, ni)
    s[C].vectorize(ni)
    return s, [A, B, C]


def loop_permutation(M, K, N):
    A, B, C = _matmul(M, K, N)
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (kaxis,) = s[C].op.reduce_axis
    ko, ki = s[C].split(kaxis, factor=KFACTOR)
    s[C].reorder(mo, no, ko, mi, ki, ni)
    s[C].vectorize(ni)
    return s, [A, B, C]


def _packed(M, K, N, bn):
    """C computed from B repacked as packedB[N/bn][K][bn] (contiguous along the tile's columns)."""
    k = te.reduce_axis((0, K), "k")
    A, B = _inputs(M, K, N)
    packedB = te.compute((N // bn, K, bn), lambda bigN, k, littleN: B[k, bigN * bn + littleN],
                         name="packedB")
    C = te.compute((M, N), lambda m, n: te.sum(A[m, k] * packedB[n // bn, k, te.indexmod(n, bn)],
                                               axis=k), name="C")
    return A, B, packedB, C


def array_packing(M, K, N):
    A, B, packedB, C = _packed(M, K, N, BN)
    s = te.create_schedule(C.op)
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    (kaxis,) = s[C].op.reduce_axis
    ko, ki = s[C].split(kaxis, factor=KFACTOR)
    s[C].reorder(mo, no, ko, mi, ki, ni)
    s[C].vectorize(ni)
    bigN, _, littleN = s[packedB].op.axis
    s[packedB].vectorize(littleN)
    s[packedB].parallel(bigN)
    return s, [A, B, C]


def _write_cache(M, K, N, parallel: bool):
    A, B, packedB, C = _packed(M, K, N, BN)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], BN, BN)
    s[CC].compute_at(s[C], no)
    mc, nc = s[CC].op.axis
    (kaxis,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kaxis, factor=KFACTOR)
    s[CC].reorder(ko, mc, ki, nc)
    s[CC].vectorize(nc)
    s[CC].unroll(ki)
    if parallel:
        s[C].parallel(mo)
    bigN, _, littleN = s[packedB].op.axis
    s[packedB].vectorize(littleN)
    s[packedB].parallel(bigN)
    return s, [A, B, C]


def block_write_cache(M, K, N):
    return _write_cache(M, K, N, parallel=False)


def parallel(M, K, N):
    return _write_cache(M, K, N, parallel=True)


def register_blocked(M, K, N):
    """Past the tutorial: an MR x NR tile of C lives in vector registers for the whole K loop.

    Threads split the NR-wide panels of packed B (the panel loop ``no`` is outermost and
    parallel, so each 256 KiB panel stays in one core's L2 while every row block uses it).
    The cache stage CC is computed at the row-block loop ``mo``; its rows and its NR / 16
    vectors are unrolled, so every access to CC has a constant offset and LLVM keeps the
    MR * NR / 16 accumulators in zmm registers. Each step of k then does MR broadcasts of A,
    NR / 16 loads of packed B and MR * NR / 16 FMAs.
    """
    A, B, packedB, C = _packed(M, K, N, NR)
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], MR, NR)
    s[C].reorder(no, mo, mi, ni)
    s[CC].compute_at(s[C], mo)
    mc, nc = s[CC].op.axis
    (kaxis,) = s[CC].op.reduce_axis
    nco, nci = s[CC].split(nc, factor=16)
    s[CC].reorder(kaxis, mc, nco, nci)
    s[CC].unroll(mc)
    s[CC].unroll(nco)
    s[CC].vectorize(nci)
    s[C].vectorize(ni)
    s[C].parallel(no)
    bigN, _, littleN = s[packedB].op.axis
    s[packedB].vectorize(littleN)
    s[packedB].parallel(bigN)
    return s, [A, B, C]


#: name -> (schedule function, the smallest size multiple it needs)
STEPS = {
    "baseline": baseline,
    "blocking": blocking,
    "vectorization": vectorization,
    "loop_permutation": loop_permutation,
    "array_packing": array_packing,
    "block_write_cache": block_write_cache,
    "parallel": parallel,
    "register": register_blocked,
}


def build_step(step: str, M: int, K: int, N: int):
    s, args = STEPS[step](M, K, N)
    return kernelrpc.build(s, args, target="llvm", name="gemm"), (s, args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="M = N = K (a multiple of 64)")
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated step names")
    parser.add_argument("--print-ir", metavar="STEP", help="print the lowered IR of one step")
    parser.add_argument("--number", type=int, default=3, help="calls per timed repeat")
    opts = parser.parse_args(argv)
    M = K = N = opts.size
    if opts.print_ir:
        s, args = STEPS[opts.print_ir](M, K, N)
        print(kernelrpc.lower(s, args, simple_mode=True))
        return 0
    dev = kernelrpc.cpu(0)
    rng = np.random.default_rng(0)
    a = rng.random((M, K), dtype=np.float32)
    b = rng.random((K, N), dtype=np.float32)
    expect = a @ b
    ta, tb = nd.array(a, dev), nd.array(b, dev)
    print(f"GEMM {M}x{K}x{N} float32 on {kernelrpc.Target('llvm')}")
    t = min(timed_numpy(a, b) for _ in range(3))
    print(f"{'numpy.dot':>18}: {2 * M * N * K / t / 1e9:8.1f} GFLOP/s")
    for step in opts.steps.split(","):
        module, _ = build_step(step, M, K, N)
        tc = nd.empty((M, N), "float32", dev)
        module(ta, tb, tc)
        np.testing.assert_allclose(tc.numpy(), expect, rtol=1e-4, atol=1e-3 * K ** 0.5)
        number = 1 if step in ("baseline", "blocking") else opts.number
        result = module.time_evaluator("gemm", dev, number=number, repeat=3)(ta, tb, tc)
        print(f"{step:>18}: {2 * M * N * K / result.median / 1e9:8.1f} GFLOP/s  (checked)")
    return 0


def timed_numpy(a, b) -> float:
    start = time.perf_counter()
    np.dot(a, b)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
