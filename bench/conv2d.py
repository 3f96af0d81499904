"""GFLOP/s of 3x3 convolutions (recipes.conv2d_nchw, recipes.conv2d_nchwc) against numpy.

    PYTHONPATH=src python bench/conv2d.py [--channels 64] [--size 56] [--rounds 5] [--threads N]
                                          [--target T]

The reference is numpy's im2col + matmul on NCHW (the im2col copy is part of its time; the
blocked layout transforms of NCHWc are not part of the kernel's, as when a network keeps
NCHWc between layers). Reference and kernels are measured in the same process, interleaved
round by round; every kernel's result is checked against the reference before it is timed.
``--target`` builds for another target that runs here (``"llvm -mcpu=haswell"``: AVX2 code);
the recipes' tiles and NCHWc blocks are that target's (``recipes.conv_tile``, ``nchwc_tile``).
"""
from __future__ import annotations

import argparse
import sys
import time

from kernel_timing import Rounds, add_arguments, calls_per_round, limit_threads, seconds_per_call


def _parse(argv=None):
    parser = argparse.ArgumentParser(description="conv2d 3x3 recipes vs numpy im2col + matmul")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--target", default="llvm", help="build for this target (default: host)")
    return add_arguments(parser).parse_args(argv)


OPTIONS = _parse() if __name__ == "__main__" else None
if OPTIONS is not None:
    limit_threads(OPTIONS.threads)

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import nd  # noqa: E402
from kernelrpc.compiler import recipes  # noqa: E402


def im2col_conv(data, kernel):
    """NCHW, stride 1, padding 1: im2col (a copy) and one matmul."""
    n, c, h, w = data.shape
    f = kernel.shape[0]
    padded = np.pad(data[0], ((0, 0), (1, 1), (1, 1)))
    cols = sliding_window_view(padded, (3, 3), axis=(1, 2))          # c, h, w, 3, 3
    cols = cols.transpose(0, 3, 4, 1, 2).reshape(c * 9, h * w)       # copies
    return (kernel.reshape(f, c * 9) @ cols).reshape(1, f, h, w)


def main(opts) -> int:
    c = f = opts.channels
    h = w = opts.size
    flop = 2.0 * f * h * w * c * 9
    rng = np.random.default_rng(0)
    data = rng.random((1, c, h, w), dtype=np.float32)
    kernel = rng.random((f, c, 3, 3), dtype=np.float32)
    expect = im2col_conv(data, kernel)
    dev = kernelrpc.cpu(0)
    cb, fb, _ = recipes.nchwc_tile(opts.target)
    layouts = {
        "nchw": (recipes.conv2d_nchw, data, kernel, lambda o: o),
        "nchwc": (recipes.conv2d_nchwc,
                  data.reshape(1, c // cb, cb, h, w).transpose(0, 1, 3, 4, 2).copy(),
                  kernel.reshape(f // fb, fb, c // cb, cb, 3, 3).transpose(0, 2, 4, 5, 3, 1).copy(),
                  lambda o: o.transpose(0, 1, 4, 2, 3).reshape(1, f, h, w)),
    }
    runs = {}
    for name, (recipe, d, k, to_nchw) in layouts.items():
        start = time.perf_counter()
        s, args = recipe(1, c, h, w, f, target=opts.target)
        module = kernelrpc.build(s, args, target=opts.target, name="conv")
        compile_s = time.perf_counter() - start
        out_shape = tuple(int(x.value) for x in args[2].shape)
        td, tk, to = nd.array(d, dev), nd.array(k, dev), nd.empty(out_shape, "float32", dev)
        module(td, tk, to)
        np.testing.assert_allclose(to_nchw(to.numpy()), expect, rtol=1e-4, atol=1e-3)
        start = time.perf_counter()
        module(td, tk, to)
        number = calls_per_round(time.perf_counter() - start)
        evaluate = module.time_evaluator("conv", dev, number=number, repeat=1)
        runs[name] = lambda evaluate=evaluate, args=(td, tk, to): evaluate(*args).median
        print(f"built {name:<6} in {compile_s:5.2f} s, checked against numpy", flush=True)
    np_number = calls_per_round(seconds_per_call(lambda: im2col_conv(data, kernel), 1))
    rounds = Rounds(lambda: seconds_per_call(lambda: im2col_conv(data, kernel), np_number),
                    runs).run(opts.rounds, flop)
    print()
    print(f"conv2d 3x3, {c}->{f} channels, {h}x{w}, stride 1, pad 1, float32, "
          f"{opts.rounds} interleaved rounds, threads: {opts.threads or 'all cores'}, "
          f"target {kernelrpc.Target(opts.target)}")
    rounds.print_table("numpy im2col + matmul", label=lambda name: "recipes.conv2d_" + name,
                       width=26)
    return 0


if __name__ == "__main__":
    sys.exit(main(OPTIONS))
