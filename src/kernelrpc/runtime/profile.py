"""ProfileResult: what time_evaluator returns (and what crosses the wire as a plain dict)."""
from __future__ import annotations

import math
import statistics

MAX_RESULTS = 1 << 20


class ProfileResult:
    """Timing of one time_evaluator call; ``results`` is seconds per call for every repeat."""

    __slots__ = ("results", "number", "repeat", "target", "function")

    def __init__(self, results, number: int, target: dict | None = None, function: str = ""):
        results = tuple(float(r) for r in results)
        if not results:
            raise ValueError("a ProfileResult needs at least one repeat")
        self.results = results
        self.number = number
        self.repeat = len(results)
        self.target = dict(target or {})
        self.function = function

    @property
    def mean(self) -> float:
        return statistics.fmean(self.results)

    @property
    def median(self) -> float:
        return statistics.median(self.results)

    @property
    def min(self) -> float:
        return min(self.results)

    @property
    def max(self) -> float:
        return max(self.results)

    @property
    def std(self) -> float:
        """Population standard deviation, as numpy.std (and TVM's BenchmarkResult) computes it."""
        return statistics.pstdev(self.results)

    def to_dict(self) -> dict:
        return {"results": list(self.results), "number": self.number, "repeat": self.repeat,
                "target": dict(self.target), "function": self.function}

    @classmethod
    def from_dict(cls, data) -> ProfileResult:
        """Rebuild from :meth:`to_dict` output, validating it (it may come from the network)."""
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
        return cls(results, number, target, function)

    def __eq__(self, other) -> bool:
        return isinstance(other, ProfileResult) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (f"ProfileResult(mean={self.mean:.6g}, median={self.median:.6g}, min={self.min:.6g}, "
                f"max={self.max:.6g}, std={self.std:.6g}, number={self.number}, "
                f"repeat={self.repeat})")

    def __str__(self) -> str:
        ms = [v * 1e3 for v in (self.mean, self.median, self.max, self.min, self.std)]
        header = " ".join(f"{h:^12}" for h in
                          ("mean (ms)", "median (ms)", "max (ms)", "min (ms)", "std (ms)"))
        values = " ".join(f"{v:^12.4f}" for v in ms)
        target = self.target.get("string", "")
        where = f"{self.function or 'function'}"
        if target:
            where += f" on {target}"
        return (f"Execution time summary ({where}, number={self.number}, "
                f"repeat={self.repeat}):\n{header}\n{values}")


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
