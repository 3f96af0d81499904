"""Cost of a parallel region on the module thread pool, next to a serial call of the same kernel.

    PYTHONPATH=src python bench/parallel_launch.py

A kernel with an (almost) empty parallel loop is timed with the module's native loop
(``time_evaluator``), with the pool at 1 thread (no launch: runs inline) and at all
cores; the difference is the launch + join overhead per region. A second figure is
the first call after the pool has gone to sleep (wake-up latency, ctypes call included), and a
third the CPU time the process uses in the 0.3 s after a launch (the workers spin briefly, then
sleep: an idle pool should cost next to nothing).
Reference: the same kernel dispatched to 2 Python threads (ThreadPoolExecutor; ctypes
drops the GIL), the alternative the module pool replaces.
"""
from __future__ import annotations

import resource
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kernelrpc
from kernelrpc import nd, te


def main() -> int:
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    s[B].parallel(B.op.axis[0])
    module = kernelrpc.build(s, [A, B], name="tiny")
    dev = kernelrpc.cpu(0)
    a, b = nd.array(np.zeros(n, np.float32), dev), nd.empty((n,), "float32", dev)
    runtime_module = module.runtime_module
    rows = []
    for threads in (1, 0):
        used = runtime_module.set_num_threads(threads)
        evaluate = module.time_evaluator("tiny", dev, number=20000, repeat=5)
        result = evaluate(a, b)
        rows.append((f"threads={used}", result.median * 1e6, result.min * 1e6))
    wake = []
    for _ in range(10):
        threading.Event().wait(0.05)  # let the workers go to sleep
        start = time.perf_counter()
        module(a, b)
        wake.append((time.perf_counter() - start) * 1e6)
    runtime_module.set_num_threads(1)
    function = module["tiny"]
    python_pool = []
    with ThreadPoolExecutor(max_workers=2) as executor:
        for _ in range(2000):
            start = time.perf_counter()
            for future in [executor.submit(function, a, b) for _ in range(2)]:
                future.result()
            python_pool.append((time.perf_counter() - start) * 1e6)
    runtime_module.set_num_threads(0)
    idle = []
    for _ in range(5):
        module(a, b)
        before = resource.getrusage(resource.RUSAGE_SELF)
        threading.Event().wait(0.3)
        after = resource.getrusage(resource.RUSAGE_SELF)
        idle.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3)
    print(f"{'case':<30}{'median us':>12}{'min us':>10}")
    for name, median, low in rows:
        print(f"{name + ' (per call, native loop)':<30}{median:>12.3f}{low:>10.3f}")
    print(f"{'launch overhead (all - 1)':<30}{rows[1][1] - rows[0][1]:>12.3f}")
    print(f"{'call after idle (ctypes+wake)':<30}{statistics.median(wake):>12.1f}{min(wake):>10.1f}")
    print(f"{'CPU in 0.3 s after (ms)':<30}{statistics.median(idle):>12.1f}{min(idle):>10.1f}")
    print(f"{'reference: 2 Python threads':<30}{statistics.median(python_pool):>12.1f}"
          f"{min(python_pool):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
