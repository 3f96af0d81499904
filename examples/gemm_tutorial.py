"""How to optimize GEMM on CPU, with kernelrpc.te: TVM's classic tutorial, step by step.

The schedules are ``kernelrpc.compiler.recipes`` (read ``tutorial_schedule`` beside TVM's
tutorial: baseline, blocking, vectorization, loop permutation, array packing, block write
cache, parallel; then one step past it, ``register_blocked``, a tile of vector accumulators
over packed B). This script builds each step, checks it against numpy and times it.

Run::

    python examples/gemm_tutorial.py                       # all steps, 1024^3
    python examples/gemm_tutorial.py --size 512 --steps blocking,register
    python examples/gemm_tutorial.py --print-ir register --size 256
    python examples/gemm_tutorial.py --steps register --target "llvm -mcpu=haswell"  # AVX2 code
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import kernelrpc
from kernelrpc import nd
from kernelrpc.compiler import recipes

STEPS = (*recipes.TUTORIAL_STEPS, "register")


def schedule(step: str, size: int, target: str = "llvm"):
    """``(s, [A, B, C])`` of one step for C = A @ B, all three ``size`` x ``size`` float32;
    the register step's tile is ``target``'s."""
    if step == "register":
        return recipes.register_blocked(size, size, size, target=target)
    return recipes.tutorial_schedule(step, size, size, size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", type=int, default=1024, help="M = N = K")
    parser.add_argument("--steps", default=",".join(STEPS), help="comma-separated step names")
    parser.add_argument("--print-ir", metavar="STEP", choices=STEPS, help="print the lowered IR of one step")
    parser.add_argument("--number", type=int, default=3, help="calls per timed repeat")
    parser.add_argument("--target", default="llvm", help="build for this target, one this host runs")
    opts = parser.parse_args(argv)
    size = opts.size
    if opts.print_ir:
        print(kernelrpc.lower(*schedule(opts.print_ir, size, opts.target), simple_mode=True))
        return 0
    dev = kernelrpc.cpu(0)
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    expect = a @ b
    ta, tb = nd.array(a, dev), nd.array(b, dev)
    flops = 2 * size ** 3
    print(f"GEMM {size}^3 float32 on {kernelrpc.Target(opts.target)}")
    print(f"{'numpy.dot':>18}: {flops / min(timed_numpy(a, b) for _ in range(3)) / 1e9:8.1f} GFLOP/s")
    for step in opts.steps.split(","):
        module = kernelrpc.build(*schedule(step, size, opts.target), target=opts.target, name="gemm")
        tc = nd.empty((size, size), "float32", dev)
        module(ta, tb, tc)
        np.testing.assert_allclose(tc.numpy(), expect, rtol=1e-4, atol=1e-3 * size ** 0.5)
        number = 1 if step in ("baseline", "blocking") else opts.number
        result = module.time_evaluator("gemm", dev, number=number, repeat=3)(ta, tb, tc)
        print(f"{step:>18}: {flops / result.median / 1e9:8.1f} GFLOP/s  (checked)")
    return 0


def timed_numpy(a, b) -> float:
    start = time.perf_counter()
    np.dot(a, b)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
