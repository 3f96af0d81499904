"""What one measured candidate came to, and how a batch of them renders (text and HTML)."""
from __future__ import annotations

import dataclasses
import html

OK = "ok"
COMPILE_ERROR = "compile_error"
RUNTIME_ERROR = "runtime_error"
WRONG_RESULT = "wrong_result"
TIMEOUT = "timeout"
STATUSES = (OK, COMPILE_ERROR, RUNTIME_ERROR, WRONG_RESULT, TIMEOUT)


@dataclasses.dataclass
class MeasureResult:
    """One candidate's outcome.

    ``status`` is one of ``ok``, ``compile_error``, ``runtime_error`` (the kernel raised, crashed
    its session or the device went away), ``wrong_result`` (outputs differ from the reference)
    and ``timeout``; ``error`` says what went wrong, ``profile`` is the ProfileResult of a
    candidate that ran correctly.
    """

    index: int
    name: str
    status: str
    profile: object = None          # kernelrpc.runtime.profile.ProfileResult
    error: str = ""
    detail: str = ""                # traceback (host build) or remote traceback
    device: str = ""                # the server's address
    cpus: list | None = None        # the cores the device server runs on, if it reports them
    build_seconds: float = 0.0
    run_seconds: float = 0.0        # wall time the device spent on this candidate
    flops: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def mean(self) -> float | None:
        """Mean seconds per call (None unless ``ok``)."""
        return self.profile.mean if self.profile is not None else None

    @property
    def gflops(self) -> float | None:
        if self.profile is None or not self.flops:
            return None
        return self.flops / self.profile.median / 1e9

    def summary(self) -> str:
        if self.ok:
            text = format_seconds(self.profile.median)
            if self.gflops is not None:
                text += f"  {self.gflops:.1f} GFLOP/s"
            return text
        return self.error.splitlines()[0][:160] if self.error else ""

    def __str__(self) -> str:
        where = f" on {self.device}" if self.device else ""
        return f"[{self.index}] {self.name}: {self.status}{where}  {self.summary()}"


def format_seconds(seconds: float) -> str:
    """A time with a unit chosen for its magnitude: ``812 ns``, ``35.2 µs``, ``4.10 ms``, ``2.00 s``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def text_table(results: list[MeasureResult]) -> str:
    rows = [("#", "candidate", "status", "median", "GFLOP/s", "device", "error")]
    for r in results:
        rows.append((str(r.index), r.name, r.status,
                     format_seconds(r.profile.median) if r.ok else "",
                     f"{r.gflops:.1f}" if r.gflops is not None else "", r.device,
                     (r.error.splitlines() or [""])[0][:70]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def html_table(results: list[MeasureResult], caption: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in ("#", "candidate", "status", "median", "GFLOP/s",
                                             "device", "error"))
    body = []
    for r in results:
        cells = (r.index, r.name, r.status, format_seconds(r.profile.median) if r.ok else "",
                 f"{r.gflops:.1f}" if r.gflops is not None else "", r.device,
                 (r.error.splitlines() or [""])[0][:200])
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
