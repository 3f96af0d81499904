"""Tune GEMM with kernelrpc.autotvm, from a template that knows nothing of the hand-written recipe.

The template packs B into panels as wide as the column tile, keeps a tile of C in a cache stage
computed at one of the outer tile loops, and leaves every size and loop annotation to the tuner:
tile rows and columns, vector width, the reduction split and its unrolling, loop order and which
loops run in parallel. The tuner measures candidates on every free device of ``--key`` at the
tracker ``--tracker`` (default ``$KERNELRPC_TRACKER``, else 127.0.0.1:9190); when no tracker
listens there, a local tracker and ``--devices`` device servers are started for the run (it
says so) and stopped at the end. It logs every measurement to
``--log`` (resumable: run again to continue) and prints the best schedule with its GFLOP/s
against numpy on the same device.

Run::

    PYTHONPATH=src python examples/tune_gemm.py --size 512 --trials 64      # a local fleet if no tracker
    PYTHONPATH=src python examples/tune_gemm.py --tracker 10.0.0.5:9190 --key rpi4 --trials 200
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time

import numpy as np

import kernelrpc
from kernelrpc import autotvm, te
from kernelrpc.cli import host_port
from kernelrpc.deploy.fleet import connect_or_start


@autotvm.template("example/gemm")
def gemm(M, N, K):
    cfg = autotvm.get_config()
    cfg.define_knob("tile_x", [16, 32, 64, 128])
    cfg.define_split("tile_y", M, num_outputs=2, policy="power2", max_factor=16)
    cfg.define_split("tile_k", K, num_outputs=2, policy="power2", max_factor=8)
    cfg.define_knob("lanes", [8, 16])
    cfg.define_knob("order", ["cols_outer", "rows_outer"])
    cfg.define_knob("cache_at", ["rows", "cols"])
    cfg.define_knob("unroll_tile", [True, False])
    cfg.define_knob("parallel", [True, False])

    bn = cfg["tile_x"].val
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    panels = (N + bn - 1) // bn
    packed = te.compute((panels, K, bn),
                        lambda p, kk, j: te.if_then_else(p * bn + j < N, B[kk, p * bn + j], 0.0),
                        name="packedB")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * packed[j // bn, k, j % bn], axis=k), name="C")

    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "global")
    i, j = s[C].op.axis
    io, ii = cfg["tile_y"].apply(s, C, i)
    jo, ji = s[C].split(j, factor=bn)
    outer = (jo, io) if cfg["order"].val == "cols_outer" else (io, jo)
    s[C].reorder(*outer, ii, ji)
    s[CC].compute_at(s[C], outer[1] if cfg["cache_at"].val == "rows" else outer[0])
    ci, cj = s[CC].op.axis
    (ck,) = s[CC].op.reduce_axis
    ko, ki = cfg["tile_k"].apply(s, CC, ck)
    cjo, cji = s[CC].split(cj, factor=min(cfg["lanes"].val, bn))
    s[CC].reorder(ko, ki, ci, cjo, cji)
    if cfg["unroll_tile"].val and cfg["cache_at"].val == "rows":
        s[CC].unroll(ci)
        s[CC].unroll(cjo)
    if cfg["tile_k"].size[-1] > 1:
        s[CC].unroll(ki)
    s[CC].vectorize(cji)
    s[C].vectorize(ji)
    if cfg["parallel"].val:
        s[C].parallel(outer[0])
    p, _, pj = s[packed].op.axis
    s[packed].vectorize(pj)
    s[packed].parallel(p)
    return s, [A, B, C]


@contextlib.contextmanager
def local_fleet(devices: int, key: str = "local", server_args=lambda index: []):
    """A tracker and ``devices`` device servers on loopback, every server registered; stopped
    afterwards. ``server_args(index)`` are extra options of each server (``["--cpus", "1"]``)."""
    from kernelrpc.deploy.fleet import LocalFleet

    with LocalFleet(key, devices, server_args) as fleet:
        yield fleet.host, fleet.port, key


def numpy_gflops(M, N, K, repeat: int = 5) -> float:
    rng = np.random.default_rng(0)
    a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
    np.dot(a, b)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        np.dot(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * M * N * K / best / 1e9


def tune(M, N, K, host, port, key, trials, log_path, tuner_name="ga", number=2, repeat=3, seed=0,
         callbacks=()):
    """Tune the template; returns ``(tuner, task)``."""
    task = autotvm.task.create("example/gemm", args=(M, N, K), reference=lambda a, b: a @ b,
                               flop=2 * M * N * K)
    tuner = {"ga": autotvm.tuner.GATuner, "model": autotvm.tuner.ModelTuner,
             "random": autotvm.tuner.RandomTuner}[tuner_name](task, seed=seed)
    with contextlib.suppress(FileNotFoundError):
        resumed = tuner.load_history(autotvm.load_from_file(log_path))
        if resumed:
            print(f"resumed {resumed} measurements from {log_path}")
    option = autotvm.measure_option(runner=autotvm.RPCRunner(key, host, port, number=number,
                                                             repeat=repeat, timeout=120,
                                                             rtol=1e-3, atol=1e-2 * K ** 0.5))
    tuner.tune(trials, option, callbacks=[autotvm.callback.log_to_file(log_path), *callbacks])
    return tuner, task


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=512, help="M = N = K")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--tuner", choices=["ga", "model", "random"], default="ga")
    parser.add_argument("--tracker", type=host_port, metavar="HOST:PORT",
                        default=os.environ.get("KERNELRPC_TRACKER", "127.0.0.1:9190"),
                        help="the tracker; when none listens there, a local one is started "
                             "(default: $KERNELRPC_TRACKER or 127.0.0.1:9190)")
    parser.add_argument("--key", default=os.environ.get("KERNELRPC_KEY", "local"),
                        help="device key (default: $KERNELRPC_KEY or local)")
    parser.add_argument("--devices", type=int, default=1,
                        help="device servers to start when no tracker listens at --tracker")
    parser.add_argument("--log", default="tune_gemm.log", help="JSON-lines log (appended, resumable)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    M = N = K = opts.size
    with contextlib.closing(connect_or_start(*opts.tracker, opts.key, devices=opts.devices)) as tracker:
        (host, port), key = tracker.addr, opts.key

        def progress(tuner, config, result):
            mark = f"{result.gflops:7.1f} GFLOP/s" if result.ok else result.status
            print(f"trial {tuner.trials:4d}: {mark:>16}   best {tuner.best_flops:7.1f}   {config}")

        tuner, task = tune(M, N, K, host, port, key, opts.trials, opts.log, opts.tuner,
                           callbacks=[progress])
    if tuner.best_config is None:
        print("no configuration ran correctly")
        return 1
    with autotvm.apply_history_best(opts.log):
        s, args = gemm(M, N, K)
    print(f"\nbest of {len(tuner.visited)} configurations in a space of {len(task.config_space)}:")
    print(f"  {tuner.best_config}")
    print(f"  {tuner.best_flops:.1f} GFLOP/s tuned  vs  {numpy_gflops(M, N, K):.1f} GFLOP/s numpy.dot "
          f"(on this host)\n")
    print(kernelrpc.lower(s, args, simple_mode=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
