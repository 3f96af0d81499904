"""Boards side by side in a notebook: one bar per board at its median latency, whiskers to its
90th and 99th percentiles, emulated boards hatched and labelled as such, flags beside the bar.

Takes the rows the model command reports (``--json``'s ``boards``) or the database keeps
(:func:`kernelrpc.results.store.rows`, ``latest_per_board``); needs matplotlib.
"""
from __future__ import annotations

from ..display import time_unit
from .trust import EMULATED


def _emulated(row: dict) -> bool:
    facts = row.get("facts") or {}
    return bool(row.get("emulated", facts.get("emulated")))


def _label(row: dict) -> str:
    facts = row.get("facts") or {}
    cpu = row.get("cpu_model") or facts.get("cpu_model") or row.get("machine") or facts.get("machine")
    label = " ".join(str(part) for part in (row.get("key"), row.get("board")) if part)
    return f"{label}\n{cpu}" if cpu else label


def plot_boards(rows: list[dict], ax=None, title: str | None = None):
    """A horizontal bar per board; returns the matplotlib Axes."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plot_boards needs matplotlib: pip install matplotlib (in a kernelrpc "
                          "checkout: pip install '.[notebook]')") from None
    rows = [r for r in rows if isinstance(r.get("p50"), (int, float))]
    if not rows:
        raise ValueError("plot_boards: no row with a latency (p50) to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.2))
    unit, scale = time_unit(max(r["p50"] for r in rows))
    ys = list(range(len(rows)))
    for y, row in zip(ys, rows):
        emulated = _emulated(row)
        ax.barh(y, row["p50"] / scale, color="tab:gray" if emulated else "tab:blue",
                hatch="//" if emulated else None, edgecolor="black", linewidth=0.5,
                label=EMULATED if emulated else None)
        tails = [row.get(p) for p in ("p90", "p99") if isinstance(row.get(p), (int, float))]
        if tails:
            ax.plot([row["p50"] / scale, max(tails) / scale], [y, y], color="black", linewidth=1)
            ax.plot([t / scale for t in tails], [y] * len(tails), "k|", markersize=10)
        notes = [f for f in row.get("flags") or () if f != EMULATED]
        if notes:
            ax.annotate("; ".join(notes), (max([row["p50"], *tails]) / scale, y),
                        xytext=(6, 0), textcoords="offset points", va="center", fontsize=8,
                        color="tab:red")
    ax.set_yticks(ys)
    ax.set_yticklabels([_label(r) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel(f"latency ({unit}): bar p50, ticks p90 and p99")
    model = rows[0].get("model")
    ax.set_title(title or (f"{model} on {len(rows)} boards" if model else f"{len(rows)} boards"))
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles[:1], labels[:1], loc="lower right")
    return ax
