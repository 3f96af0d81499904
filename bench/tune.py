"""Batch measurement and tuning on a local fleet: throughput, device idleness, best GEMM found.

    PYTHONPATH=src python bench/tune.py [--size 1024] [--trials 200] [--batch 32] [--devices 2]

Starts a tracker and ``--devices`` device servers on loopback, then runs three parts. With
``--pin``, device server i runs on the i-th last core (``--cpus``) and this process (the build
pool and numpy) on the cores left, so that builds do not disturb measurements on a small machine.

1. builds ``--batch`` random configurations of examples/tune_gemm.py's template on the default
   process pool alone: candidates built per second;
2. runs another ``--batch`` random configurations through ``kernelrpc.measure`` (builds and runs
   overlapping): candidates measured per second and the fraction of the time the devices held
   by the batch sat idle (goal: under 10%; idle time is time a device waits for builds);
3. tunes the template with ``--tuner`` (genetic by default) for ``--trials`` trials, then
   measures the best configuration, the hand-written recipes (kernelrpc.compiler.recipes) and
   numpy.dot side by side at the end (each kernel alone in its batch, so no build runs while it
   is timed).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="candidates in the throughput batches")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--pin", action="store_true",
                        help="device servers on the last cores, builds and numpy on the others")
    parser.add_argument("--tuner", choices=["ga", "model", "random"], default="ga")
    parser.add_argument("--number", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    return parser.parse_args(argv)


OPTIONS = parse() if __name__ == "__main__" else None
CORES = sorted(os.sched_getaffinity(0))
DEVICE_CORES: list[int] = []
if OPTIONS is not None and OPTIONS.pin:
    if OPTIONS.devices >= len(CORES):
        sys.exit(f"--pin needs more cores than devices ({len(CORES)} cores, {OPTIONS.devices} devices)")
    DEVICE_CORES = CORES[-OPTIONS.devices:]
    os.sched_setaffinity(0, CORES[:-OPTIONS.devices])    # before numpy sizes its BLAS pool

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import cloudpickle  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import autotvm  # noqa: E402
from kernelrpc.compiler import recipes  # noqa: E402
from kernelrpc.measure import default_executor  # noqa: E402
from kernelrpc.measure.build import build_candidate, dumps_candidate  # noqa: E402

import tune_gemm  # noqa: E402

cloudpickle.register_pickle_by_value(tune_gemm)   # the template travels to build workers by value


TUNERS = {"ga": autotvm.tuner.GATuner, "model": autotvm.tuner.ModelTuner,
          "random": autotvm.tuner.RandomTuner}


def random_configs(task, n: int, seed: int):
    tuner = autotvm.tuner.RandomTuner(task, seed=seed)
    return tuner.next_batch(n)


def main(opts) -> int:
    M = N = K = opts.size
    flop = 2 * M * N * K
    task = autotvm.task.create("example/gemm", args=(M, N, K), reference=lambda a, b: a @ b, flop=flop)
    rng = np.random.default_rng(0)
    a, b = rng.random((M, K), dtype=np.float32), rng.random((K, N), dtype=np.float32)
    expect = a @ b
    tolerance = dict(rtol=1e-3, atol=1e-2 * K ** 0.5)
    print(f"GEMM {M}x{N}x{K} float32; template space {len(task.config_space)} configurations; "
          f"{opts.devices} device servers on cores {DEVICE_CORES or CORES}, builds and numpy on "
          f"cores {sorted(os.sched_getaffinity(0))}")

    # 1. builds alone
    configs = random_configs(task, opts.batch, seed=1)
    with default_executor() as pool:
        list(pool.map(int, range(8)))                       # start the workers first
        start = time.perf_counter()
        futures = [pool.submit(build_candidate, dumps_candidate(task.candidate(c)), None, "main")
                   for c in configs]
        built = [f.result() for f in concurrent.futures.as_completed(futures)]
        build_wall = time.perf_counter() - start
    failed = sum(1 for out in built if out.library is None)
    print(f"\n1. build only: {len(built)} candidates in {build_wall:.1f} s = "
          f"{len(built) / build_wall:.2f} built/s ({failed} failed); "
          f"mean {np.mean([o.seconds for o in built]):.2f} s per build in a worker")

    cores = (lambda i: ["--cpus", str(DEVICE_CORES[i])]) if DEVICE_CORES else (lambda i: [])
    with tune_gemm.local_fleet(opts.devices, key="bench", server_args=cores) as (_, port, _):
        common = dict(key="bench", tracker=("127.0.0.1", port), inputs=[a, b], reference=[expect],
                      number=opts.number, repeat=opts.repeat, timeout=300, flops=flop, **tolerance)
        # 2. builds and runs overlapping
        configs = random_configs(task, opts.batch, seed=2)
        batch = kernelrpc.measure([(f"#{c.index}", task.candidate(c)) for c in configs], **common)
        batch.wait()
        st = batch.stats()
        print(f"\n2. measure(): {st['candidates']} candidates in {st['wall_seconds']:.1f} s: "
              f"{st['built_per_second']:.2f} built/s, {st['measured_per_second']:.2f} measured/s, "
              f"devices idle {100 * st['device_idle_fraction']:.1f}% of the time they were held "
              f"(goal < 10%); statuses {st['statuses']}")
        for d in st["devices"]:
            print(f"   device {d['address']} cores {d['cpus']}: {d['measured']} measured, busy "
                  f"{d['busy_seconds']:.1f} s of {d['held_seconds']:.1f} s held")

        # 3. tuning with a fixed budget
        log_path = Path(tempfile.mkdtemp(prefix="kernelrpc-bench-")) / "gemm.log"
        tuner = TUNERS[opts.tuner](task, seed=0)
        option = autotvm.measure_option(runner=autotvm.RPCRunner(
            "bench", "127.0.0.1", port, number=opts.number, repeat=opts.repeat, timeout=300,
            **tolerance))
        start = time.perf_counter()
        first_at = {}

        def note(tuner, config, result):
            if result.ok and (not first_at or result.gflops > max(first_at)):
                first_at[result.gflops] = tuner.trials

        tuner.tune(opts.trials, option, callbacks=[autotvm.callback.log_to_file(log_path), note],
                   batch_size=32)
        tune_wall = time.perf_counter() - start
        records = autotvm.load_from_file(log_path)
        statuses = {}
        for r in records:
            statuses[r["result"]["status"]] = statuses.get(r["result"]["status"], 0) + 1
        print(f"\n3. {opts.tuner} tuner: {len(records)} trials in {tune_wall:.0f} s ({statuses}); best "
              f"{tuner.best_flops:.1f} GFLOP/s found at trial {first_at[max(first_at)] if first_at else '-'}")
        print(f"   best configuration: {tuner.best_config}")

        # side by side: each kernel alone in its batch, then numpy in this process
        final = [("tuned (best of log)", task.candidate(tuner.best_config))] if tuner.best_config else []
        final += [("recipe register_blocked", lambda: recipes.register_blocked(M, N, K)),
                 ("recipe tutorial 'parallel'", lambda: recipes.tutorial_schedule("parallel", M, N, K))]
        final_options = {**common, "number": max(opts.number, 2), "repeat": max(opts.repeat, 5),
                         "max_devices": 1}
        rows = [kernelrpc.measure([item], **final_options).wait()[0] for item in final]
    np.dot(a, b)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        np.dot(a, b)
        times.append(time.perf_counter() - t0)
    numpy_gflops = flop / float(np.median(times)) / 1e9
    print(f"\n   {'':28s} {'GFLOP/s':>8}  {'x numpy':>8}")
    for r in rows:
        value = r.gflops or 0.0
        print(f"   {r.name:28s} {value:8.1f}  {value / numpy_gflops:8.2f}   {'' if r.ok else r.status}")
    print(f"   {'numpy.dot (this process)':28s} {numpy_gflops:8.1f}  {1.0:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(OPTIONS))
