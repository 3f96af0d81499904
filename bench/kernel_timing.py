"""The timing helpers of the kernel benchmarks (bench/gemm.py, bench/conv2d.py).

Every kernel benchmark measures a numpy reference and several kernels in one process,
interleaved round by round, so that a noisy neighbour slows both sides of a ratio alike.
This module is that procedure once: the thread limit that must be set before numpy loads,
how many calls make one round, the reference's clock, the interleaved rounds and the table.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time

#: target time of one measurement (one round of one kernel)
ROUND_SECONDS = 0.25
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "KERNELRPC_NUM_THREADS")


def add_arguments(parser):
    """``--rounds`` and ``--threads``, the options every kernel benchmark takes."""
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=0, help="0: as configured / all cores")
    return parser


def limit_threads(threads: int) -> None:
    """Limit numpy's BLAS and the kernels' pool to ``threads`` (0: leave as configured).

    Call it before numpy is imported: BLAS reads its variables once, when it loads.
    """
    if threads > 0:
        for var in THREAD_VARIABLES:
            os.environ[var] = str(threads)


def limit_blas_core(core: str) -> None:
    """Make numpy's OpenBLAS run the kernels of ``core`` (``OPENBLAS_CORETYPE``: ``Haswell``
    for its AVX2 kernels on an AVX-512 host), so that code built for a narrower target than
    this host's is compared with numpy at the same width. Before numpy is imported, as
    :func:`limit_threads`."""
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core


def blas_core() -> str:
    """The kernels numpy's OpenBLAS runs (its core name, ``Haswell``, ``SkylakeX``...), asked
    of the library this process loaded; "" when numpy's BLAS is not an OpenBLAS that says."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return ""
    for path in sorted(paths):
        library = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                       "openblas_get_corename64_", "openblas_get_corename"):
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return ""


def seconds_per_call(fn, number: int) -> float:
    """Wall-clock seconds of one call of ``fn``, over ``number`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def calls_per_round(one_call_seconds: float) -> int:
    """How many calls fill ``ROUND_SECONDS``."""
    return max(1, int(ROUND_SECONDS / max(one_call_seconds, 1e-6)))


class Rounds:
    """Rates of a reference and of named kernels, measured interleaved round by round.

    ``kernels`` maps a name to a function that returns the seconds of one call;
    ``once`` names kernels measured in the first round only (too slow for more).
    Every ratio is the kernel's rate over the reference's rate of the same round.
    """

    def __init__(self, reference, kernels: dict, once=()):
        self.reference, self.kernels, self.once = reference, kernels, set(once)
        self.reference_rates: list = []
        self.rates = {name: [] for name in kernels}
        self.ratios = {name: [] for name in kernels}

    def run(self, rounds: int, work: float) -> "Rounds":
        for round_ in range(rounds):
            ref = work / self.reference() / 1e9
            self.reference_rates.append(ref)
            for name, seconds in self.kernels.items():
                if name in self.once and round_ > 0:
                    continue
                rate = work / seconds() / 1e9
                self.rates[name].append(rate)
                self.ratios[name].append(rate / ref)
        return self

    def print_table(self, reference_name: str, heading: str = "kernel",
                    label=lambda name: name, width: int = 20, peak: float = 0.0) -> None:
        """GFLOP/s median, min and max, and the median ratio, one row a kernel; with ``peak``
        (GFLOP/s) the median's share of it too."""
        share = (lambda rate: f"{rate / peak:>9.0%}") if peak else (lambda rate: "")
        print(f"{heading:<{width}}{'GFLOP/s':>10}{'min':>9}{'max':>9}{'x numpy':>10}"
              + (f"{'of peak':>9}" if peak else ""))
        ref = self.reference_rates
        print(f"{reference_name:<{width}}{statistics.median(ref):>10.1f}{min(ref):>9.1f}"
              f"{max(ref):>9.1f}{1.0:>10.2f}{share(statistics.median(ref))}")
        for name, values in self.rates.items():
            note = "  (1 round: slow)" if name in self.once else ""
            median = statistics.median(values)
            print(f"{label(name):<{width}}{median:>10.1f}{min(values):>9.1f}{max(values):>9.1f}"
                  f"{statistics.median(self.ratios[name]):>10.2f}{share(median)}{note}")
