"""Tune GEMM with kernelrpc.autotvm, from a template that knows nothing of the hand-written recipe.

The template packs B into panels as wide as the column tile, keeps a tile of C in a cache stage
computed at one of the outer tile loops, and leaves every size and loop annotation to the tuner:
tile rows and columns, vector width, the reduction split and its unrolling, loop order and which
loops run in parallel. The tuner measures candidates on every free device of ``--key`` (a local
tracker and device server are started when no ``--tracker`` is given), logs every measurement to
``--log`` (resumable: run again to continue) and prints the best schedule with its GFLOP/s
against numpy on the same device.

Run::

    PYTHONPATH=src python examples/tune_gemm.py --size 512 --trials 64
    PYTHONPATH=src python examples/tune_gemm.py --tracker 10.0.0.5:9190 --key rpi4 --trials 200
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time

import numpy as np

import kernelrpc
from kernelrpc import autotvm, te


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
    """A tracker and ``devices`` device servers on loopback, stopped afterwards.

    ``server_args(index)`` are extra options of each server (``["--cpus", "1"]``).
    """
    from kernelrpc.deploy.launch import Service

    services = [Service("kernelrpc.tracker", ["--port", "0"])]
    try:
        port = services[0].port
        for index in range(devices):
            services.append(Service("kernelrpc.server", ["--port", "0", "--key", key,
                                                         "--tracker", f"127.0.0.1:{port}",
                                                         *server_args(index)]))
        with kernelrpc.rpc.connect_tracker("127.0.0.1", port) as tracker:
            end = time.monotonic() + 30
            while tracker.summary()["queue_info"].get(key, {}).get("free", 0) < devices:
                if time.monotonic() > end:
                    raise RuntimeError("the local device servers did not register")
                time.sleep(0.05)
        yield "127.0.0.1", port, key
    finally:
        for svc in reversed(services):
            svc.stop()


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
    parser.add_argument("--tracker", metavar="HOST:PORT", help="default: start a local fleet")
    parser.add_argument("--key", default="local")
    parser.add_argument("--devices", type=int, default=1, help="local device servers to start")
    parser.add_argument("--log", default="tune_gemm.log", help="JSON-lines log (appended, resumable)")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    M = N = K = opts.size
    with contextlib.ExitStack() as stack:
        if opts.tracker:
            host, _, port = opts.tracker.rpartition(":")
            host, port, key = host, int(port), opts.key
        else:
            host, port, key = stack.enter_context(local_fleet(opts.devices))

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
