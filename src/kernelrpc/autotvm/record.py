"""The tuning log: one JSON line per measurement, appended as results come in.

A line holds the workload (template name and arguments), the target, the configuration as
``{knob: value}`` with its index in the space, and the outcome (status, seconds per repeat,
GFLOP/s, error text, device). Logs are resumable (``Tuner.load_history``) and the best entry of a
workload applies back to its template (``apply_history_best``).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time

from ..measure.result import OK
from .task import DispatchContext

log = logging.getLogger(__name__)

VERSION = 1


def encode(task, config, result) -> str:
    """One log line for ``result`` (a :class:`kernelrpc.measure.MeasureResult`) of ``config``."""
    profile = result.profile
    return json.dumps({
        "version": VERSION,
        "workload": [task.name, *task.args],
        "target": task.target,
        "config": {"index": config.index, "knobs": config.to_dict()},
        "result": {"status": result.status,
                   "costs": list(profile.results) if profile is not None else [],
                   "mean": profile.mean if profile is not None else None,
                   "gflops": result.gflops, "error": result.error.splitlines()[0][:500] if result.error else "",
                   "device": result.device, "build_seconds": round(result.build_seconds, 6),
                   "timestamp": round(time.time(), 3)},
    })


def decode(line: str) -> dict | None:
    """A log record, or None for a line that is not one (a truncated last line, say)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("version") != VERSION:
        return None
    try:
        workload, config, result = record["workload"], record["config"], record["result"]
        if not (isinstance(workload, list) and workload and isinstance(config["knobs"], dict)
                and isinstance(result["status"], str)):
            return None
    except (KeyError, TypeError):
        return None
    return record


def load_from_file(path) -> list[dict]:
    """Every valid record of a log; lines that do not parse are skipped (and counted in the log)."""
    records, skipped = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = decode(line)
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
    if skipped:
        log.warning("%s: skipped %d lines that are not tuning records", path, skipped)
    return records


def log_to_file(path):
    """A tuner callback appending every measurement to ``path`` (flushed line by line; one
    line at a time when tuners of several tasks share the callback from their threads)."""
    path = os.fspath(path)
    lock = threading.Lock()

    def callback(tuner, config, result) -> None:
        line = encode(tuner.task, config, result) + "\n"
        with lock, open(path, "a", encoding="utf-8") as f:
            f.write(line)
    return callback


def _key(workload) -> tuple:
    return tuple(json.dumps(x) for x in workload)


def same_target(record: dict, target) -> bool:
    """A record measured for ``target`` (a target string, or None for a task without one)."""
    return record.get("target") == (None if target is None else str(target))


def best_records(records) -> dict:
    """The fastest correct record per workload and target: ``{workload key: {target: record}}``."""
    best: dict = {}
    for record in records:
        result = record["result"]
        if result["status"] != OK or result.get("mean") is None:
            continue
        per_target = best.setdefault(_key(record["workload"]), {})
        target = record.get("target")
        if target not in per_target or result["mean"] < per_target[target]["result"]["mean"]:
            per_target[target] = record
    return best


class ApplyHistoryBest(DispatchContext):
    """Within ``with apply_history_best(log):``, a template called with a tuned workload's
    arguments gets that workload's best logged configuration for ``target``. A configuration
    is the fastest for the target it was measured on only: without ``target``, a workload
    tuned for several targets is an error, never one target's choice applied to another."""

    def __init__(self, records, target=None) -> None:
        if isinstance(records, (str, os.PathLike)):
            records = load_from_file(records)
        self.target = None if target is None else str(target)
        self.best = best_records(records)

    def query(self, template, args, quiet=False):
        per_target = self.best.get(_key([template.name, *args]), {})
        if self.target is not None:
            record = per_target.get(self.target)
        elif len(per_target) > 1:
            raise ValueError(f"the log holds configurations of {template.name}{tuple(args)} for "
                             f"{len(per_target)} targets ({', '.join(map(str, per_target))}): "
                             "say which with apply_history_best(log, target=...)")
        else:
            record = next(iter(per_target.values()), None)
        if record is None:
            if not quiet:
                log.warning("no tuned configuration for %s%s%s in the log; using the default one",
                            template.name, tuple(args),
                            f" on {self.target}" if self.target is not None else "")
            return None
        return template.space(tuple(args)).from_values(record["config"]["knobs"])


def apply_history_best(records, target=None) -> ApplyHistoryBest:
    """``with autotvm.apply_history_best("gemm.log"): s, args = gemm(M, N, K)``; ``target``
    picks that target's configurations from a log shared by several."""
    return ApplyHistoryBest(records, target)
