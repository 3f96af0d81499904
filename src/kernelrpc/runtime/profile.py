"""ProfileResult: what time_evaluator returns (and what crosses the wire as a plain dict), with
the statistics and device conditions that say how far to trust it."""
from __future__ import annotations

import math

from ..display import format_percent, format_rate, format_time, time_unit
from .conditions import check_conditions

MAX_RESULTS = 1 << 20
#: Version of the dict form (to_dict): 1 had no ``version`` key and no ``conditions``.
FORMAT_VERSION = 2
#: Default disturbance thresholds (see ProfileResult.disturbance).
DISTURBED_LOAD = 0.10
FREQ_SPREAD = 0.10
#: Tukey's fences: repeats this many interquartile ranges beyond the quartiles are outliers.
OUTLIER_IQR = 1.5


class ProfileResult:
    """Timing of one time_evaluator call; ``results`` is seconds per call for every repeat.

    Besides TVM's statistics it says how far to trust them: ``cv`` (the coefficient of
    variation), ``outliers`` (repeats outside Tukey's fences), and ``conditions``, what the
    device saw while it timed (runtime/conditions.py), judged by :attr:`disturbance`.
    ``flops``, when set by the caller, adds GFLOP/s to the text and HTML forms.
    """

    __slots__ = ("results", "number", "repeat", "target", "function", "_conditions", "_decode", "flops")

    def __init__(self, results, number: int, target: dict | None = None, function: str = "",
                 conditions: dict | None = None, flops: float | None = None):
        results = tuple(map(float, results))
        if not results:
            raise ValueError("a ProfileResult needs at least one repeat")
        self.results = results
        self.number = number
        self.repeat = len(results)
        self.target = dict(target or {})
        self.function = function
        self._conditions = conditions
        self._decode = None
        self.flops = flops

    @property
    def conditions(self) -> dict | None:
        """What the device saw while it timed (runtime/conditions.py), or None if not reported.
        A result that arrived packed decodes them here, at the first read: a damaged conditions
        part raises its ProtocolError then (and at every read after)."""
        decode = self._decode
        if decode is not None:
            self._conditions = decode()
            self._decode = None
        return self._conditions

    @conditions.setter
    def conditions(self, value: dict | None) -> None:
        self._conditions = value
        self._decode = None

    def decode_conditions_later(self, decode) -> None:
        """Make ``decode()`` (a callable returning the conditions dict) the source of
        :attr:`conditions`, called when they are first read; the packed wire form's decoder
        (wire/protocol.py) checks their lengths and counts before it hands them over."""
        self._conditions = None
        self._decode = decode

    def __getstate__(self):
        return {name: getattr(self, name) for name in ("results", "number", "repeat", "target",
                                                        "function", "conditions", "flops")}

    def __setstate__(self, state) -> None:
        self._decode = None
        for name, value in state.items():
            setattr(self, "_conditions" if name == "conditions" else name, value)

    @property
    def mean(self) -> float:
        return _statistics().fmean(self.results)

    @property
    def median(self) -> float:
        return _statistics().median(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    @property
    def std(self) -> float:
        """Population standard deviation, as numpy.std (and TVM's BenchmarkResult) computes it."""
        return _statistics().pstdev(self.results)

    @property
    def cv(self) -> float:
        """Coefficient of variation: ``std / mean`` (0 for a single repeat)."""
        mean = self.mean
        return self.std / mean if mean > 0 else 0.0

    @property
    def outliers(self) -> list[int]:
        """Indices of the repeats outside Tukey's fences (1.5 interquartile ranges beyond the
        quartiles); needs at least 4 repeats, fewer give no verdict (an empty list)."""
        if self.repeat < 4:
            return []
        q1, _, q3 = _statistics().quantiles(self.results, n=4, method="inclusive")
        reach = OUTLIER_IQR * (q3 - q1)
        return [i for i, r in enumerate(self.results) if r < q1 - reach or r > q3 + reach]

    @property
    def gflops(self) -> float | None:
        """GFLOP/s at the median time, when ``flops`` (operations per call) is set."""
        return self.flops / self.median / 1e9 if self.flops and self.median > 0 else None

    def disturbance(self, load: float = DISTURBED_LOAD, freq_spread: float = FREQ_SPREAD) -> list[str]:
        """Why the device's conditions make this measurement doubtful; empty when they do not
        (or were not reported). ``load``: the share of the CPUs' capacity other processes may
        use (beyond one clock tick per CPU of uncertainty); ``freq_spread``: how far the CPU
        frequency may vary, as a fraction of the lowest seen."""
        c = self.conditions
        if not c:
            return []
        reasons = []
        other = c.get("other_cpu_s")
        if other is not None:
            ncpu = len(c["cpus"])
            excess = other - (c.get("clock_tick_s") or 0.0) * ncpu
            if excess > load * c["wall_s"] * ncpu:
                reasons.append(f"other processes used {format_percent(c['other_load'])} of "
                               f"CPUs {_cpu_ranges(c['cpus'])} while it ran "
                               f"({format_time(other)} of CPU time)")
        freq = c.get("freq_mhz")
        if freq and freq[0] > 0 and freq[1] > freq[0] * (1 + freq_spread):
            reasons.append(f"the CPU frequency varied from {freq[0]:.0f} to {freq[1]:.0f} MHz")
        return reasons

    @property
    def disturbed(self) -> bool:
        """True when :meth:`disturbance` (default thresholds) finds a reason to re-measure."""
        return bool(self.disturbance())

    def to_dict(self) -> dict:
        data = {"version": FORMAT_VERSION, "results": list(self.results), "number": self.number,
                "repeat": self.repeat, "target": dict(self.target), "function": self.function}
        if self.conditions is not None:
            data["conditions"] = self.conditions
        if self.flops is not None:
            data["flops"] = self.flops
        return data

    @classmethod
    def from_dict(cls, data) -> ProfileResult:
        """Rebuild from :meth:`to_dict` output, validating it (it may come from the network).
        Version 1 dicts (no ``conditions``) load with ``conditions = None``; unknown keys are
        ignored, so later versions can add fields."""
        if not isinstance(data, dict):
            raise ValueError(f"ProfileResult data must be a dict, got {type(data).__name__}")
        results = data.get("results")
        if (not isinstance(results, list) or not 0 < len(results) <= MAX_RESULTS
                or not all(_is_real(r) and math.isfinite(r) and r >= 0 for r in results)):
            raise ValueError("ProfileResult 'results' must be a non-empty list of finite "
                             "non-negative floats")
        number = data.get("number")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise ValueError(f"ProfileResult 'number' must be a positive integer, got {number!r}")
        if data.get("repeat", len(results)) != len(results):
            raise ValueError(f"ProfileResult 'repeat' is {data.get('repeat')!r} but there are "
                             f"{len(results)} results")
        target = data.get("target", {})
        function = data.get("function", "")
        if not isinstance(target, dict) or not isinstance(function, str):
            raise ValueError("ProfileResult 'target' must be a dict and 'function' a string")
        flops = data.get("flops")
        if flops is not None and not (_is_real(flops) and math.isfinite(flops) and flops >= 0):
            raise ValueError(f"ProfileResult 'flops' must be a number >= 0, got {flops!r:.60}")
        return cls(results, number, target, function, check_conditions(data.get("conditions")),
                   flops)

    def __eq__(self, other) -> bool:
        return isinstance(other, ProfileResult) and self.to_dict() == other.to_dict()

    # -- how it looks ------------------------------------------------------------------------

    def _where(self) -> str:
        where = self.function or "function"
        target = self.target.get("string", "")
        return f"{where} on {target}" if target else where

    def __repr__(self) -> str:
        parts = [f"median {format_time(self.median)}", f"min {format_time(self.min)}",
                 f"max {format_time(self.max)}", f"cv {format_percent(self.cv)}"]
        if self.gflops is not None:
            parts.append(format_rate(self.flops, self.median))
        parts.append(f"number={self.number} repeat={self.repeat}")
        if self.outliers:
            parts.append(f"{len(self.outliers)} outlier{'s' * (len(self.outliers) > 1)}")
        reasons = self.disturbance()
        if reasons:
            parts.append("DISTURBED: " + "; ".join(reasons))
        elif self.conditions is None:
            parts.append("device conditions not reported")
        return f"<ProfileResult {self.function or 'function'}: {', '.join(parts)}>"

    def table(self):
        """The summary as a ``display.Table`` (text in a terminal, HTML in Jupyter)."""
        from ..display import Table

        stats = (self.mean, self.median, self.max, self.min, self.std)
        unit = time_unit(self.median)
        header = [f"{name} ({unit[0]})" for name in ("mean", "median", "max", "min", "std")]
        row = [format_time(v, unit).split(" ")[0] for v in stats]
        header.append("cv")
        row.append(format_percent(self.cv))
        if self.gflops is not None:
            header.append("GFLOP/s")
            row.append(self.gflops)
        notes = []
        if self.outliers:
            notes.append("outlier repeats: " + ", ".join(
                f"#{i} ({format_time(self.results[i], unit)})" for i in self.outliers))
        notes.append(self.conditions_text())
        notes += [f"DISTURBED: {reason}; re-measure before trusting it"
                  for reason in self.disturbance()]
        return Table(header, [row], notes=notes,
                     title=f"Execution time summary ({self._where()}, number={self.number}, "
                           f"repeat={self.repeat}):")

    def conditions_text(self) -> str:
        """One line on what the device saw while timing."""
        c = self.conditions
        if c is None:
            return "device: conditions not reported"
        parts = [f"CPUs {_cpu_ranges(c['cpus'])}"]
        if c.get("other_cpu_s") is not None:
            parts.append(f"other processes {format_percent(c['other_load'])} "
                         f"({format_time(c['other_cpu_s'])} CPU)")
        if c.get("preempted") is not None:
            parts.append(f"{c['preempted']} preemptions")
        threads = c.get("threads") or []
        if threads:
            cpus = sorted({t["cpu"] for t in threads if t["cpu"] is not None})
            parts.append(f"{len(threads)} thread{'s' * (len(threads) > 1)} ran "
                         f"(last on CPU {_cpu_ranges(cpus)})")
        freq = c.get("freq_mhz")
        parts.append(f"{freq[0]:.0f}-{freq[1]:.0f} MHz" if freq else "frequency not exposed")
        return "device: " + ", ".join(parts)

    def __str__(self) -> str:
        return str(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def plot(self, ax=None):
        """Every repeat's time per call (outliers in red, the median dashed); needs matplotlib
        (``pip install '.[notebook]'``). Returns the matplotlib Axes."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("ProfileResult.plot() needs matplotlib: pip install matplotlib "
                              "(in a kernelrpc checkout: pip install '.[notebook]')") from None
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        name, scale = time_unit(self.median)
        outliers = set(self.outliers)
        xs = range(len(self.results))
        ax.scatter(xs, [r / scale for r in self.results],
                   c=["tab:red" if i in outliers else "tab:blue" for i in xs], zorder=2)
        ax.axhline(self.median / scale, color="gray", linestyle="--", label="median")
        ax.set_xticks(list(xs))
        ax.set_xlabel("repeat")
        ax.set_ylabel(f"time per call ({name})")
        title = f"{self.function or 'function'}: {self.repeat} repeats of {self.number} calls"
        ax.set_title(title + (" (DISTURBED)" if self.disturbed else ""))
        ax.legend(loc="best")
        return ax


def _cpu_ranges(cpus) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    cpus = sorted(cpus)
    if not cpus:
        return "?"
    spans, first, last = [], cpus[0], cpus[0]
    for c in cpus[1:]:
        if c == last + 1:
            last = c
            continue
        spans.append((first, last))
        first = last = c
    spans.append((first, last))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _statistics():
    """The ``statistics`` module, imported with the first statistic asked for: it loads
    ``fractions`` and ``decimal`` (milliseconds), which a device server encoding results, and a
    client receiving them, do without."""
    import statistics

    return statistics


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
