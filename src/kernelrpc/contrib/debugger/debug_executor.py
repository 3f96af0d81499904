"""TVM's debug executor: the time of every fused operator of a network, on its device.

    m = debug_executor.create(lib.get_graph_json(), rlib, dev)
    m.set_input("input", x)
    print(m.profile())          # a table of every node; m.profile().plot() draws it

The layers are timed by the module's native ``default_profile``: the whole network runs
``number`` times with the clock read around every kernel call in native code (no Python
between layers, each kernel over the buffers and cache state a real run gives it); ``repeat``
such runs give the per-layer medians. The sum of the layers is set against the end-to-end time
of ``default_run`` measured in the same call of :meth:`profile`, and the difference (the
executor's own cost: argument set-up and the clock reads) is reported per layer.
"""
from __future__ import annotations

import statistics

from ...display import Table, format_percent, format_rate, format_time, time_unit
from ..graph_executor import GraphModule, create as _create

__all__ = ["DebugGraphModule", "ProfileReport", "create"]


def create(graph_json_str, libmod, device, dump_root=None) -> "DebugGraphModule":
    """TVM's ``debug_executor.create``; ``dump_root`` is accepted and unused (nothing is
    written to disk)."""
    return DebugGraphModule(_create(graph_json_str, libmod, device).module)


class DebugGraphModule(GraphModule):
    def run_individual(self, number: int = 10, repeat: int = 1, min_repeat_ms: float = 0,
                       limit_zero_time_iterations: int = 100, cooldown_interval_ms: float = 0,
                       repeats_to_cooldown: int = 1) -> list:
        """Seconds per call of each node (its median over ``repeat`` runs of ``number``)."""
        runs = [self.module.profile_times(number) for _ in range(max(1, repeat))]
        return [statistics.median(col) for col in zip(*runs)]

    def profile(self, number: int = 10, repeat: int = 3) -> "ProfileReport":
        layers = self.run_individual(number, repeat)
        whole = self.module.benchmark(number=number, repeat=repeat)
        return ProfileReport(self.module.plan["kernels"], layers, whole)


class ProfileReport:
    """Every node's time and share, their sum against the end-to-end time."""

    def __init__(self, kernels: list, seconds: list, end_to_end):
        self.end_to_end = end_to_end
        self.total = sum(seconds)
        self.rows = []
        for record, t in zip(kernels, seconds):
            self.rows.append({"name": record["name"], "ops": list(record.get("ops", [])),
                              "shape": record.get("shape"), "seconds": t,
                              "share": t / self.total if self.total else 0.0,
                              "flops": record.get("flops", 0)})
        self.difference = end_to_end.median - self.total
        self.overhead_per_layer = self.difference / max(len(self.rows), 1)

    def slowest(self, n: int = 10) -> list:
        return sorted(self.rows, key=lambda r: -r["seconds"])[:n]

    def table(self, rows: list | None = None) -> Table:
        rows = self.rows if rows is None else rows
        unit = time_unit(max((r["seconds"] for r in rows), default=1e-6))
        body = [[r["name"], "+".join(r["ops"]), "x".join(map(str, r["shape"] or [])),
                 format_time(r["seconds"], unit), format_percent(r["share"]),
                 format_rate(r["flops"], r["seconds"]) if r["flops"] and r["seconds"] else "-"]
                for r in rows]
        notes = [f"sum of layers {format_time(self.total)}, end to end (median) "
                 f"{format_time(self.end_to_end.median)}: difference "
                 f"{format_time(self.difference)} ({format_time(self.overhead_per_layer)} per "
                 "layer: the executor's argument set-up and clock reads)",
                 self.end_to_end.conditions_text()]
        return Table(["node", "ops", "shape", "time", "share", "rate"], body, notes=notes,
                     title=f"Per-layer profile ({len(self.rows)} nodes)")

    def __str__(self) -> str:
        return str(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()

    def plot(self, ax=None, top: int = 20):
        """A horizontal bar chart of the ``top`` slowest nodes (needs matplotlib)."""
        import matplotlib.pyplot as plt

        rows = self.slowest(top)[::-1]
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1))
        unit = time_unit(max((r["seconds"] for r in rows), default=1e-6))
        ax.barh([f"{r['name'][:40]}" for r in rows], [r["seconds"] / unit[1] for r in rows])
        ax.set_xlabel(f"time per run ({unit[0]})")
        ax.set_title(f"slowest {len(rows)} of {len(self.rows)} layers")
        return ax
