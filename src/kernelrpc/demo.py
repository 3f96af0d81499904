"""``python -m kernelrpc demo``: the whole job on one machine, end to end.

Starts a tracker and a device server on loopback (as separate processes, the way
a lab runs them), compiles a GEMM with ``kernelrpc.te``, exports it as a shared
library, asks the tracker for a device, uploads and runs the kernel remotely,
checks the result against numpy and prints the timings.  The library it built stays
in the current directory (``--output``), to load again or send to another board.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from . import cli
from .deploy.launch import Service


def run(size: int, key: str, repeat: int, output: str = "gemm.so", target: str = "llvm") -> int:
    import numpy as np

    import kernelrpc
    from . import nd, rpc
    from .compiler import recipes

    t0 = time.perf_counter()
    tracker = Service("kernelrpc.tracker", ["--host", "127.0.0.1", "--port", "0"])
    server = None
    try:
        print(f"tracker      {tracker.host}:{tracker.port} (ready in {time.perf_counter() - t0:.2f}s)")
        server = Service("kernelrpc.server", ["--host", "127.0.0.1", "--port", "0", "--key", key,
                                              "--tracker", f"{tracker.host}:{tracker.port}"])
        server.wait_for_line("registered")
        print(f"device       {server.host}:{server.port} registered as key {key!r}")

        t = time.perf_counter()
        s, args = recipes.register_blocked(size, size, size, target=target)
        module = kernelrpc.build(s, args, target=target, name="gemm")
        lib = module.export_library(Path(output).resolve())
        print(f"compiled     gemm {size}x{size}x{size} float32 for {module.metadata['target']['string']}"
              f" in {time.perf_counter() - t:.2f}s -> {lib} ({lib.stat().st_size} bytes)")

        tracker_session = rpc.connect_tracker(tracker.host, tracker.port)
        with tracker_session.request(key, session_timeout=120) as remote:
            remote.upload(lib)
            rmod = remote.load_module(lib.name)
            dev = remote.cpu(0)
            rng = np.random.default_rng(0)
            a = rng.random((size, size), dtype=np.float32)
            b = rng.random((size, size), dtype=np.float32)
            ta, tb, tc = nd.array(a, dev), nd.array(b, dev), nd.empty((size, size), "float32", dev)
            # Timed before numpy runs here: OpenBLAS threads spin for a while after each call
            # and would take a core from the device server on this one machine.
            result = rmod.time_evaluator("gemm", dev, number=3, repeat=repeat)(ta, tb, tc)
            got = tc.numpy()
        tracker_session.close()
        expect = a @ b
        err = float(np.max(np.abs(got - expect)) / np.max(np.abs(expect)))
        print(f"checked      remote result vs numpy: max relative error {err:.1e}")
        if err > 1e-4:
            print("FAILED: the remote result does not match numpy", file=sys.stderr)
            return 1

        flops = 2.0 * size ** 3
        numpy_median = statistics.median(_time_numpy(a, b, 3) for _ in range(repeat))
        print()
        print(result)
        print()
        print(f"{'kernel':<24}{'median ms':>10}{'GFLOP/s':>10}")
        print(f"{'kernelrpc gemm (remote)':<24}{result.median * 1e3:>10.3f}{flops / result.median / 1e9:>10.1f}")
        print(f"{'numpy.dot (local)':<24}{numpy_median * 1e3:>10.3f}{flops / numpy_median / 1e9:>10.1f}")
        print(f"ratio to numpy: {numpy_median / result.median:.2f}x")
        cli.report_output("kernelrpc demo", f"timings above, compiled library at {lib}", "kernelrpc demo",
                          ["--size", size, "--key", key, "--repeat", repeat, "--output", lib,
                           "--target", target])
        return 0
    finally:
        if server is not None:
            server.stop()
        tracker.stop()


def _time_numpy(a, b, number: int) -> float:
    """Seconds per call of numpy.dot, the same way one time_evaluator repeat measures."""
    import numpy as np
    t = time.perf_counter()
    for _ in range(number):
        np.dot(a, b)
    return (time.perf_counter() - t) / number


def main(argv=None) -> int:
    parser = cli.parser("kernelrpc demo", __doc__, silent=False)
    parser.add_argument("--size", type=int, default=512, help="M = N = K of the GEMM")
    parser.add_argument("--key", default="demo", help="device key the server registers")
    parser.add_argument("--repeat", type=int, default=5, help="time_evaluator repeats")
    parser.add_argument("--output", default="gemm.so", help="where the compiled library is left")
    parser.add_argument("--target", default="llvm",
                        help="compile for this target, one this machine runs (default: its own; "
                             "'llvm -mcpu=haswell': AVX2 code, its tile from the target)")
    opts = parser.parse_args(argv)
    from .compiler.target import Target, TargetError
    try:
        runs_here = Target(opts.target).is_host
    except TargetError as err:
        parser.error(f"--target: {err}")
    if not runs_here:
        parser.error(f"--target {opts.target!r}: the demo's device is this machine, which does "
                     "not run that target's code")
    cli.setup_logging(opts)
    return run(opts.size, opts.key, opts.repeat, opts.output, opts.target)
