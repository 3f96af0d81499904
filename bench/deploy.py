"""Deployment figures: bundle size, emulated boards' start-up, export time, GEMM on each board.

    PYTHONPATH=src python bench/deploy.py [--arches aarch64,armv7,riscv64] [--size 128] [--cold]

1. The device bundle: size and build time.
2. Start-up: from launching a device server to its ready line and to "registered" at a
   tracker, for the host's own server and for each emulated board (``python -m
   kernelrpc.deploy emulate``; root file systems cached). ``--cold`` also prepares each
   root from scratch in a temporary cache (downloads ~10 MB per architecture) and links
   once with an empty zig cache (the first link per target).
3. The tutorial's final GEMM schedule (``recipes.tutorial_schedule("parallel")``), built on
   this host for the target each board reports (``remote.target()``): export time with a
   warm toolchain cache, then the result checked against numpy and the time per call on
   the board (``time_evaluator``), beside the host's server and numpy in the same run.
   Emulated timings are for correctness, not speed: qemu-user translates every
   instruction, so they say nothing about a real board.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import kernelrpc  # noqa: E402
from kernelrpc import rpc  # noqa: E402
from kernelrpc.compiler import recipes  # noqa: E402
from kernelrpc.deploy import bundle, rootfs  # noqa: E402
from servicectl import Service  # noqa: E402


def _parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arches", default=",".join(rootfs.ARCHES))
    parser.add_argument("--size", type=int, default=128, help="GEMM M = N = K")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also time cold root and first-link preparation")
    return parser.parse_args(argv)


def _row(cells, widths):
    return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))


def _table(title, header, rows):
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}\n" + _row(header, widths) + "\n" + _row(["-" * w for w in widths], widths))
    for row in rows:
        print(_row(row, widths))


def bench_bundle(tmp: Path):
    started = time.perf_counter()
    path = bundle.build_bundle(tmp / "kernelrpc-device.pyz")
    took = time.perf_counter() - started
    _table("device bundle (goal < 300 KB)", ["file", "size", "modules", "build"],
           [[path.name, f"{path.stat().st_size / 1024:.0f} KB", len(bundle.device_modules()), f"{took:.2f} s"]])
    return path


def _start(module, args, key):
    started = time.perf_counter()
    service = Service(module, args, timeout=120)
    ready = time.perf_counter() - started
    service.wait_for_line(rf"registered key {key} ", timeout=60)
    return service, ready, time.perf_counter() - started


def bench_startup(tracker, arches, cold):
    rows, boards = [], {}
    host, ready, registered = _start("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                                          "--key", "host"], "host")
    boards["host"] = host
    rows.append(["host (native)", "-", f"{ready:.2f} s", f"{registered:.2f} s"])
    for arch in arches:
        prep = "-"
        if cold:
            with tempfile.TemporaryDirectory() as cache:
                started = time.perf_counter()
                rootfs.prepare(arch, cache)
                prep = f"{time.perf_counter() - started:.1f} s"
        rootfs.prepare(arch)
        board, ready, registered = _start("kernelrpc.deploy", [
            "emulate", "--arch", arch, "--port", "0", "--tracker", f"127.0.0.1:{tracker.port}", "--key", arch], arch)
        boards[arch] = board
        rows.append([f"{arch} (qemu {rootfs.ARCHES[arch].qemu_cpu or 'default'})", prep,
                     f"{ready:.2f} s", f"{registered:.2f} s"])
    _table("start-up: launch -> ready line -> registered at the tracker", ["server", "cold root", "ready",
                                                                           "registered"], rows)
    return boards


def _cold_link(target, s, args, tmp):
    with tempfile.TemporaryDirectory() as zig_cache:
        env = os.environ.get("ZIG_GLOBAL_CACHE_DIR")
        os.environ["ZIG_GLOBAL_CACHE_DIR"] = zig_cache
        try:
            module = kernelrpc.build(s, args, target=target, name="gemm")
            started = time.perf_counter()
            module.export_library(tmp / "cold.so")
            return time.perf_counter() - started
        finally:
            if env is None:
                os.environ.pop("ZIG_GLOBAL_CACHE_DIR")
            else:
                os.environ["ZIG_GLOBAL_CACHE_DIR"] = env


def bench_gemm(tracker, names, size, repeat, cold, tmp):
    n = size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), np.float32)
    b = rng.standard_normal((n, n), np.float32)
    expected = a @ b
    flops = 2.0 * n ** 3
    np.dot(a, b)
    started = time.perf_counter()
    for _ in range(repeat):
        np.dot(a, b)
    numpy_s = (time.perf_counter() - started) / repeat
    rows = [["numpy.dot (host)", "-", "-", "-", f"{numpy_s * 1e3:.3f} ms", f"{flops / numpy_s / 1e9:.2f}"]]
    for name in names:
        with rpc.connect_tracker("127.0.0.1", tracker.port).request(name, session_timeout=600) as remote:
            target = remote.target()
            s, args = recipes.tutorial_schedule("parallel", n, n, n)
            module = kernelrpc.build(s, args, target=target, name="gemm")
            module.export_library(tmp / f"{name}.so")           # warms the toolchain's cache
            started = time.perf_counter()
            path = module.export_library(tmp / f"{name}.so")
            export = time.perf_counter() - started
            first = f"{_cold_link(target, s, args, tmp):.1f} s" if cold and name != "host" else "-"
            remote.upload(path)
            gemm = remote.load_module(path.name)
            dev = remote.cpu(0)
            ta, tb, tc = remote.array(a, dev), remote.array(b, dev), remote.empty((n, n), "float32", dev)
            gemm["gemm"](ta, tb, tc)
            np.testing.assert_allclose(tc.numpy(), expected, rtol=1e-3, atol=1e-3)
            seconds = gemm.time_evaluator("gemm", dev, number=1, repeat=repeat)(ta, tb, tc).mean
            short = re.sub(r"-mattr=(\S{24})\S+", r"-mattr=\1...", target)
            rows.append([f"{name}: {short}", f"{export * 1e3:.0f} ms", first, "ok",
                         f"{seconds * 1e3:.3f} ms", f"{flops / seconds / 1e9:.2f}"])
    _table(f"GEMM {n}x{n}x{n}, tutorial's final schedule, built here for each board's remote.target()\n"
           "(emulated timings are for correctness, not speed: qemu-user translates every instruction)",
           ["board: target", "export (warm)", "first link", "vs numpy", "time/call", "GFLOP/s"], rows)


def main(argv=None) -> int:
    opts = _parse(argv)
    arches = [a for a in opts.arches.split(",") if a]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bench_bundle(tmp)
        tracker = Service("kernelrpc.tracker", ["--port", "0"])
        boards = {}
        try:
            boards = bench_startup(tracker, arches, opts.cold)
            bench_gemm(tracker, list(boards), opts.size, opts.repeat, opts.cold, tmp)
        finally:
            for board in boards.values():
                board.stop()
            tracker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
