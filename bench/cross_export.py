"""Export time and module size per cross target: warm toolchain cache, and the first link cold.

    PYTHONPATH=src python bench/cross_export.py [--no-cold]

For each target the tutorial's final GEMM schedule (1024^3, parallel) is built once and
exported several times with the toolchain kernelrpc picks (the host cc for the host, zig
cc for the others). "warm" is the median export with zig's cache
(``$ZIG_GLOBAL_CACHE_DIR``) and kernelrpc's runtime object cache filled; "cold" is one
export with both caches empty (fresh directories): zig then builds its glibc stubs and
compiler_rt for the target. Reference: the host target linked by the host cc, same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = [
    ("host (cc)", "llvm"),
    ("aarch64", "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"),
    ("armv7 neon", "llvm -mtriple=armv7-linux-gnueabihf -mattr=+neon"),
    ("armv7 vfp3d16", "llvm -mtriple=armv7-linux-gnueabihf -mattr=+vfp3d16,-neon"),
    ("riscv64", "llvm -mtriple=riscv64-linux-gnu"),
]

_COLD = r"""
import sys, time
import kernelrpc
from kernelrpc.compiler import recipes
s, args = recipes.tutorial_schedule("parallel", 1024, 1024, 1024)
module = kernelrpc.build(s, args, target=sys.argv[1], name="gemm")
start = time.perf_counter()
module.export_library(sys.argv[2])
print(time.perf_counter() - start)
"""


def cold_export(target: str, out: Path) -> float:
    """One export in a child process with empty zig and kernelrpc caches."""
    with tempfile.TemporaryDirectory(prefix="kernelrpc-cold-") as tmp:
        env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=f"{tmp}/zig", KERNELRPC_CACHE_DIR=f"{tmp}/krpc")
        proc = subprocess.run([sys.executable, "-c", _COLD, target, str(out)], env=env,
                              capture_output=True, text=True, check=True)
        return float(proc.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-cold", action="store_true", help="skip the cold first links")
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()

    import kernelrpc
    from kernelrpc.compiler import recipes

    rows = []
    with tempfile.TemporaryDirectory(prefix="kernelrpc-bench-") as tmp:
        for label, target in TARGETS:
            s, args = recipes.tutorial_schedule("parallel", 1024, 1024, 1024)
            start = time.perf_counter()
            module = kernelrpc.build(s, args, target=target, name="gemm")
            build_s = time.perf_counter() - start
            out = Path(tmp) / f"{label.replace(' ', '_')}.so"
            module.export_library(out)              # fills the caches
            warm = []
            for _ in range(options.repeat):
                start = time.perf_counter()
                module.export_library(out)
                warm.append(time.perf_counter() - start)
            cold = None if options.no_cold else cold_export(target, Path(tmp) / "cold.so")
            rows.append((label, module.metadata["target"]["toolchain"], build_s,
                         statistics.median(warm), min(warm), cold, out.stat().st_size))
    print(f"{'target':<15}{'toolchain':<11}{'build s':>9}{'export warm s':>15}{'min s':>8}"
          f"{'first link cold s':>19}{'module KB':>11}")
    for label, chain, build_s, median, low, cold, size in rows:
        cold_text = "-" if cold is None else f"{cold:.2f}"
        print(f"{label:<15}{chain:<11}{build_s:>9.2f}{median:>15.3f}{low:>8.3f}{cold_text:>19}"
              f"{size / 1024:>11.1f}")
    print("warm: median of", options.repeat, "exports with zig's and kernelrpc's caches filled; "
          "cold: empty ZIG_GLOBAL_CACHE_DIR and KERNELRPC_CACHE_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
