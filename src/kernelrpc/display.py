"""How results look: times in a unit that fits their magnitude, tables that render as text in a
terminal and as HTML in Jupyter, and progress bars that appear only where someone watches.

Standard library only at import time (ProfileResult uses it on devices too), and little of it:
tqdm is imported when a progress bar is wanted, matplotlib when a plot is, ``html`` when Jupyter
renders a table.
"""
from __future__ import annotations

import math
import os
import sys

_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit (name, seconds per unit) in which ``seconds`` reads as 1 to 999."""
    magnitude = abs(seconds)
    for name, scale in _TIME_UNITS:
        if magnitude >= scale * 0.9995:
            return name, scale
    return _TIME_UNITS[-1]


def format_time(seconds: float, unit: tuple[str, float] | None = None, digits: int = 4) -> str:
    """``seconds`` with ``digits`` significant digits in its own unit (or the one given):
    ``format_time(1.234e-5) == '12.34 µs'``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    name, scale = unit or time_unit(seconds)
    return f"{_significant(seconds / scale, digits)} {name}"


def _significant(value: float, digits: int) -> str:
    if value == 0:
        return "0"
    exponent = int(math.floor(math.log10(abs(value))))
    if round(abs(value), digits - 1 - exponent) >= 10.0 ** (exponent + 1):
        exponent += 1  # 0.99996 rounds to 1.000, not 1.0000
    return f"{value:.{max(digits - 1 - exponent, 0)}f}"


def format_rate(flops: float, seconds: float) -> str:
    """``flops`` floating-point operations in ``seconds``, as GFLOP/s."""
    if not seconds or not math.isfinite(seconds):
        return "-"
    return f"{_significant(flops / seconds / 1e9, 4)} GFLOP/s"


def format_percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"


class Table:
    """Rows of cells with a header; ``str()`` aligns them in columns, Jupyter shows HTML.

    ``notes`` are lines shown under the table (warnings such as a disturbed measurement);
    ``title`` above it.
    """

    def __init__(self, header: list[str], rows: list[list], *, title: str = "",
                 notes: list[str] | None = None) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[_cell(c) for c in row] for row in rows]
        self.title = title
        self.notes = list(notes or [])

    def __str__(self) -> str:
        widths = [max(len(row[i]) for row in [self.header, *self.rows])
                  for i in range(len(self.header))]
        lines = [self.title] if self.title else []
        lines.append("  ".join(h.rjust(w) for h, w in zip(self.header, widths)))
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in self.rows]
        lines += self.notes
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from html import escape as esc  # Jupyter only; ``html`` loads all its entities

        parts = ["<div class='kernelrpc-table'>"]
        if self.title:
            parts.append(f"<p><b>{esc(self.title)}</b></p>")
        parts.append("<table><thead><tr>")
        parts += [f"<th>{esc(h)}</th>" for h in self.header]
        parts.append("</tr></thead><tbody>")
        for row in self.rows:
            parts.append("<tr>" + "".join(f"<td style='text-align:right'>{esc(c)}</td>"
                                          for c in row) + "</tr>")
        parts.append("</tbody></table>")
        parts += [f"<p style='color:#b35900'>{esc(note)}</p>" for note in self.notes]
        parts.append("</div>")
        return "".join(parts)


def _cell(value) -> str:
    if isinstance(value, float):
        return _significant(value, 4) if math.isfinite(value) else "-"
    return "-" if value is None else str(value)


def compare(results: dict, flops: float | None = None, *, title: str = "") -> Table:
    """One row per named ProfileResult (median, min, max, CV, outliers, GFLOP/s when ``flops``
    is given, and whether the device saw a disturbance): the table a notebook shows after a
    sweep."""
    header = ["", "median", "min", "max", "cv", "outliers"]
    if flops:
        header.append("GFLOP/s")
    header.append("device")
    rows = []
    for name, result in results.items():
        row = [name, format_time(result.median), format_time(result.min),
               format_time(result.max), format_percent(result.cv), len(result.outliers)]
        if flops:
            row.append(flops / result.median / 1e9)
        row.append("disturbed" if result.disturbed else
                   ("clean" if result.conditions else "not reported"))
        rows.append(row)
    return Table(header, rows, title=title)


# -- progress ------------------------------------------------------------------------------

#: Set to "0" to turn progress bars off, "1" to force them on (even when output is not a terminal).
PROGRESS_ENV = "KERNELRPC_PROGRESS"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where tqdm's notebook widget can be shown)."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except AttributeError:
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def progress_enabled(setting: bool | None = None) -> bool:
    """Whether to show progress: ``setting`` if given, else ``KERNELRPC_PROGRESS``, else only in
    a notebook or when stderr is a terminal."""
    if setting is not None:
        return bool(setting)
    env = os.environ.get(PROGRESS_ENV)
    if env is not None:
        return env.strip().lower() not in ("", "0", "false", "no", "off")
    stderr = sys.stderr
    return in_notebook() or bool(stderr is not None and hasattr(stderr, "isatty")
                                 and stderr.isatty())


class _NoProgress:
    """Stands in for a bar when progress is off, so callers need no branches."""

    n = 0
    disable = True

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(total: float | None = None, desc: str = "", *, unit: str = "it",
             enabled: bool | None = None, **kwargs):
    """A tqdm bar: the notebook widget in Jupyter (with ipywidgets; a text bar without), a text
    bar on a terminal, nothing otherwise (see :func:`progress_enabled`). Without tqdm installed
    there is no bar either."""
    if not progress_enabled(enabled):
        return _NoProgress()
    import importlib.util

    try:
        if in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm
        else:  # a terminal, or a notebook without ipywidgets: a text bar
            from tqdm.std import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, desc=desc, unit=unit, leave=False, **kwargs)


def byte_progress(total: int, desc: str, enabled: bool | None = None):
    """A bar counting bytes (KiB/MiB/GiB scaled by tqdm)."""
    return progress(total, desc, unit="B", enabled=enabled, unit_scale=True,
                    unit_divisor=1024)
