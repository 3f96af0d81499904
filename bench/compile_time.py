"""Seconds to lower and to build every GEMM tutorial step (kernelrpc.compiler.recipes).

    PYTHONPATH=src python bench/compile_time.py [--size 1024] [--rounds 5]
    python bench/compile_time.py --tree old/src --tree src     # two trees, interleaved

With ``--tree`` (repeatable) every round runs one child process per tree, in turn, so two
versions of the compiler are compared side by side on the same loaded machine. ``lower`` is the
Python part (schedule -> loop IR, the passes); ``build`` adds LLVM code generation and
optimisation (no linking). Each round keeps the fastest of ``--repeat`` runs of a step (the
machine is shared: the minimum is what the code costs); the table shows the median of those
over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(size: int, repeat: int) -> dict:
    """step -> (lower seconds, build seconds), each the fastest of ``repeat`` runs."""
    from kernelrpc.compiler import recipes
    from kernelrpc.compiler.build import build
    from kernelrpc.compiler.lower import lower

    steps = (*recipes.TUTORIAL_STEPS, "register")
    out = {}
    for step in steps:
        make = (lambda: recipes.register_blocked(size, size, size)) if step == "register" else (
            lambda: recipes.tutorial_schedule(step, size, size, size))
        lowered = built = float("inf")
        for _ in range(repeat):
            s, args = make()
            start = time.perf_counter()
            lower(s, args, name="gemm")
            lowered = min(lowered, time.perf_counter() - start)
            s, args = make()
            start = time.perf_counter()
            build(s, args, target="llvm", name="gemm").get_source("ll-opt")
            built = min(built, time.perf_counter() - start)
        out[step] = (lowered, built)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="runs per step and round (fastest)")
    parser.add_argument("--tree", action="append", default=[],
                        help="a src/ folder to measure in a child process (repeatable)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(measure(opts.size, opts.repeat)))
        return 0
    trees = opts.tree or [None]
    samples = {tree: [] for tree in trees}
    for _ in range(opts.rounds):
        for tree in trees:
            if tree is None:
                samples[tree].append(measure(opts.size, opts.repeat))
                continue
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            child = subprocess.run([sys.executable, __file__, "--child", "--size", str(opts.size),
                                    "--repeat", str(opts.repeat)],
                                   env=env, check=True, capture_output=True, text=True)
            samples[tree].append(json.loads(child.stdout))
    steps = list(samples[trees[0]][0])
    print(f"GEMM {opts.size}^3, lower / build seconds, median of {opts.rounds} interleaved rounds "
          f"(fastest of {opts.repeat} runs each)")
    print(f"{'step':<20}" + "".join(f"{str(t or 'this tree'):>28}" for t in trees))
    for step in [*steps, "total"]:
        cells = []
        for tree in trees:
            pick = (lambda r, i: sum(v[i] for v in r.values())) if step == "total" else (
                lambda r, i: r[step][i])
            low = statistics.median(pick(r, 0) for r in samples[tree])
            full = statistics.median(pick(r, 1) for r in samples[tree])
            cells.append(f"{low:>12.3f} / {full:<12.3f}")
        print(f"{step:<20}" + "".join(f"{c:>28}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
