"""Reading the results back: boards side by side, and regressions of a model on a board.

A regression (or an improvement) is the newest run of a model on a board whose p50 lies
further from the median p50 of that pair's earlier runs than those runs spread (their highest
p50 minus their lowest). At least :data:`MIN_EARLIER` earlier runs are needed to know the spread.
"""
from __future__ import annotations

import statistics

MIN_EARLIER = 2


def _pairs(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """Rows per (model hash, board), oldest first (``rows`` is oldest first)."""
    pairs: dict = {}
    for row in rows:
        pairs.setdefault((row["model_hash"], row["board"]), []).append(row)
    return pairs


def side_by_side(rows: list[dict]) -> list[dict]:
    """Per model: the newest run on each board (``{"model", "model_hash", "boards": [...]}``)."""
    models: dict = {}
    for (model_hash, _), runs in _pairs(rows).items():
        latest = runs[-1]
        entry = models.setdefault(model_hash, {"model": latest["model"], "model_hash": model_hash, "boards": []})
        entry["boards"].append({name: latest[name] for name in (
            "board", "key", "cpu_model", "cpus", "target", "build_hash", "p50", "p90", "p99",
            "peak_rss_bytes", "flags", "recorded", "id")})
    for entry in models.values():
        entry["boards"].sort(key=lambda b: b["p50"])
    return list(models.values())


def regressions(rows: list[dict]) -> list[dict]:
    """The (model, board) pairs whose newest p50 moved by more than their earlier runs' spread."""
    found = []
    for (model_hash, board), runs in _pairs(rows).items():
        earlier, latest = runs[:-1], runs[-1]
        if len(earlier) < MIN_EARLIER:
            continue
        p50s = [r["p50"] for r in earlier]
        baseline, spread = statistics.median(p50s), max(p50s) - min(p50s)
        change = latest["p50"] - baseline
        if abs(change) > spread:
            found.append({"kind": "regression" if change > 0 else "improvement", "model": latest["model"],
                          "model_hash": model_hash, "board": board, "p50": latest["p50"],
                          "baseline_p50": baseline, "spread": spread, "change": change / baseline,
                          "earlier_runs": len(earlier), "build_hash": latest["build_hash"],
                          "earlier_build_hashes": sorted({r["build_hash"] for r in earlier}),
                          "id": latest["id"]})
    return found
