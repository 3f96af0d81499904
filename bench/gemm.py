"""GFLOP/s of every GEMM tutorial step (kernelrpc.compiler.recipes) against numpy.dot.

    PYTHONPATH=src python bench/gemm.py [--shapes 1024,2048,1000x999x1001] [--rounds 5]
                                        [--steps a,b,...] [--threads N] [--target T]
                                        [--blas-core CORE]

A shape is ``S`` (S x S x S) or ``MxKxN``; every shape gets its own table, each measured
side by side with numpy in the same run. ``--target`` builds the kernels for another target
that runs here (``"llvm -mcpu=haswell"``: AVX2 code on an AVX-512 host); the register step's
tile is that target's (``recipes.gemm_tile``). numpy runs OpenBLAS's kernels for this host
unless ``--blas-core`` names others (``OPENBLAS_CORETYPE``: ``--blas-core Haswell`` runs its
AVX2 kernels, the reference for AVX2 code on an AVX-512 host); the table names the core
OpenBLAS ran. The last column is each rate's share of the target's multiply-add peak
(``kernelrpc.compiler.peak``: one thread's times the threads, the higher of its measurements
before and after the rounds).

numpy.dot and the kernels are measured in the same process, interleaved round by
round (numpy, then every step, then numpy again...), so that a noisy neighbour on
the machine slows both sides of a ratio alike. Kernels are timed with
``time_evaluator`` (the module's native clock_gettime loop); numpy with
``time.perf_counter`` around back-to-back calls. Every kernel's result is checked
against numpy before it is timed. Steps slower than ``--slow-seconds`` per call
are timed in the first round only. ``--threads N`` limits both sides (numpy's BLAS
through its environment variables, the kernels through KERNELRPC_NUM_THREADS); it
must be known before numpy loads, so it is read from the command line first.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from kernel_timing import (Rounds, add_arguments, blas_core, calls_per_round, limit_blas_core,
                           limit_threads, seconds_per_call)


def _parse(argv=None):
    parser = argparse.ArgumentParser(description="GEMM tutorial steps vs numpy.dot")
    parser.add_argument("--size", type=int, default=None, help="one square size (old form)")
    parser.add_argument("--shapes", default="1024",
                        help="comma-separated S or MxKxN, e.g. 1024,2048,1000x999x1001")
    parser.add_argument("--steps", default=None, help="comma-separated (default: all)")
    parser.add_argument("--slow-seconds", type=float, default=0.5)
    parser.add_argument("--target", default="llvm", help="build for this target (default: host)")
    parser.add_argument("--blas-core", default="",
                        help="OPENBLAS_CORETYPE for numpy (Haswell: AVX2 kernels; default: host's)")
    return add_arguments(parser).parse_args(argv)


OPTIONS = _parse() if __name__ == "__main__" else None
if OPTIONS is not None:
    limit_threads(OPTIONS.threads)
    limit_blas_core(OPTIONS.blas_core)

import numpy as np  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import nd  # noqa: E402
from kernelrpc.compiler import recipes  # noqa: E402
from kernelrpc.compiler.peak import fma_peak_gflops  # noqa: E402
from kernelrpc.runtime.threads import default_num_threads  # noqa: E402

# The recipes are the tutorial's schedules with padded packing, so odd shapes are right too.
STEPS = (*recipes.TUTORIAL_STEPS, "register")


def build_step(step: str, M: int, K: int, N: int, target: str = "llvm"):
    if step == "register":
        s, args = recipes.register_blocked(M, N, K, target=target)
    else:
        s, args = recipes.tutorial_schedule(step, M, N, K)
    return kernelrpc.build(s, args, target=target, name="gemm"), (s, args)


def _shapes(opts) -> list:
    if opts.size is not None:
        return [(opts.size,) * 3]
    out = []
    for item in opts.shapes.split(","):
        dims = [int(d) for d in item.lower().split("x")]
        out.append(tuple(dims * 3) if len(dims) == 1 else tuple(dims))
    return out


def main(opts) -> int:
    for M, K, N in _shapes(opts):
        run_shape(opts, M, K, N)
    return 0


def peak_gflops(opts) -> float:
    """The target's multiply-add peak for the threads of the run: one thread's times the
    threads (cores at their one-core clock: an upper bound)."""
    return fma_peak_gflops(opts.target) * (opts.threads or default_num_threads())


def run_shape(opts, M: int, K: int, N: int) -> None:
    flop = 2.0 * M * N * K
    steps = (opts.steps or ",".join(STEPS)).split(",")
    dev = kernelrpc.cpu(0)
    rng = np.random.default_rng(0)
    a = rng.random((M, K), dtype=np.float32)
    b = rng.random((K, N), dtype=np.float32)
    expect = a @ b
    ta, tb = nd.array(a, dev), nd.array(b, dev)

    evaluators, modules, slow = {}, {}, set()
    for step in steps:
        start = time.perf_counter()
        module, _ = build_step(step, M, K, N, opts.target)
        compile_s = time.perf_counter() - start
        tc = nd.empty((M, N), "float32", dev)
        module(ta, tb, tc)  # links and loads the module, starts the thread pool
        np.testing.assert_allclose(tc.numpy(), expect, rtol=1e-4, atol=1e-3 * K ** 0.5)
        start = time.perf_counter()
        module(ta, tb, tc)
        call_s = time.perf_counter() - start
        if call_s > opts.slow_seconds:
            slow.add(step)
        evaluate = module.time_evaluator("gemm", dev, number=calls_per_round(call_s), repeat=1)
        evaluators[step] = lambda evaluate=evaluate, tc=tc: evaluate(ta, tb, tc).median
        modules[step] = module
        print(f"built {step:<18} in {compile_s:5.2f} s, checked against numpy, "
              f"one call {call_s * 1e3:8.1f} ms", flush=True)
    np.dot(a, b)
    peak = peak_gflops(opts)
    np_number = calls_per_round(seconds_per_call(lambda: np.dot(a, b), 1))
    rounds = Rounds(lambda: seconds_per_call(lambda: np.dot(a, b), np_number),
                    evaluators, once=slow).run(opts.rounds, flop)
    peak = max(peak, peak_gflops(opts))   # the clock follows the other cores' load

    target = modules[steps[0]].target if steps else kernelrpc.Target("llvm")
    print()
    print(f"GEMM {M}x{K}x{N} float32, target {target}, {opts.rounds} interleaved rounds")
    threads = opts.threads or "all cores"
    print(f"threads: {threads} (kernels: module pool; numpy: "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    print(f"numpy: OpenBLAS {blas_core() or '(core not known)'} kernels; peak: {peak:.1f} GFLOP/s "
          f"(the target's multiply-add peak, one thread's times the threads)")
    rounds.print_table("numpy.dot", heading="step", peak=peak)
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main(OPTIONS))
