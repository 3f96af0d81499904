"""Tuning every task of a network, as TVM's "tune a network" tutorials do, with a resumable log.

::

    tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
    report = autotvm.tune_tasks(tasks, n_trial=64, log_file="net.log",
                                measure_option=autotvm.measure_option(
                                    runner=autotvm.RPCRunner("rpi4", "tracker-host", 9190)))
    print(report)
    with autotvm.apply_history_best("net.log"):
        lib = relay.build(mod, target=target, params=params)

Each task's tuner first takes in what the log already holds of it, so an interrupted run
continues where it stopped: a task with ``n_trial`` logged measurements is not measured again.

The devices wait for nothing but measurements (docs/models.md, "Tuning a network"): every
task builds on one process pool, started once for the run (a pool per task started two
interpreters importing kernelrpc and llvmlite: 1.7-2 s before the task's first build here),
and ``overlap`` tasks tune at once, each in its own thread with its own tuner, so one task's
round builds while another's measures; a round asks for its device once all its candidates
are built, and gives it back when they are measured. Each task's search is the same as alone
(its own seeded tuner, its rounds in order); only the order of the log's lines mixes. On a
2-core machine with the device server on it (and other work: load average 4), with 24 trials
per task and the build cache and kernel reuse of ``Tuner.tune``, ResNet-18 went from 121-142 s
(devices idle 46-49% of the time held) to 88-95 s (idle 1%), MobileNet-v2 from 142-158 s
(idle 75-76%) to 62-76 s (idle 2%), runs taking turns.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from .record import load_from_file, log_to_file
from .tuner import GATuner, GridSearchTuner, ModelTuner, RandomTuner

log = logging.getLogger(__name__)

TUNERS = {"ga": GATuner, "model": ModelTuner, "random": RandomTuner, "grid": GridSearchTuner}


@dataclass
class TaskTuning:
    """One task's tuning: measurements (logged before, made now), default and best times."""

    task: object
    resumed: int
    measured: int
    default_seconds: float | None
    best_seconds: float | None
    best_gflops: float
    wall_seconds: float
    rounds: list = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.default_seconds is None or not self.best_seconds:
            return None
        return self.default_seconds / self.best_seconds


@dataclass
class NetworkTuning:
    """What ``tune_tasks`` did: a row per task, and the figures of the whole run."""

    tasks: list
    wall_seconds: float

    def totals(self) -> dict:
        """The run's figures. A device is *held* from the session the tracker gave a round to
        its end, and *busy* while it uploads, loads, checks and times a candidate; its idle
        share is the rest of the held time (waiting for builds, the inputs' upload, the
        tuner's turn between candidates). Between rounds the device is back at the tracker,
        free for anyone: not held; ``measuring_share`` is the busy time against the whole run
        (``wall_seconds`` times the devices used), what the devices did for this run at all.
        ``built`` counts builds run, not candidates taken from a task's build cache
        (``cached``); ``reused``: builds whose kernel had been compiled and linked before, by
        another configuration that lowers to the same code."""
        rounds = [r for t in self.tasks for r in t.rounds]
        held = sum(d["held_seconds"] for r in rounds for d in r["devices"])
        busy = sum(d["busy_seconds"] for r in rounds for d in r["devices"])
        measured = sum(t.measured for t in self.tasks)
        built = sum(r.get("built", r["candidates"]) for r in rounds)
        wall = self.wall_seconds
        devices = len({d["address"] for r in rounds for d in r["devices"]})
        return {"tasks": len(self.tasks), "measured": measured,
                "resumed": sum(t.resumed for t in self.tasks),
                "wall_seconds": wall, "built": built,
                "cached": sum(r.get("cached", 0) for r in rounds),
                "reused": sum(r.get("reused", 0) for r in rounds),
                "built_per_second": built / wall if wall else 0.0,
                "measured_per_second": measured / wall if wall else 0.0,
                "devices": devices, "held_seconds": held, "busy_seconds": busy,
                "device_idle_fraction": 1 - busy / held if held > 0 else None,
                "measuring_share": busy / (wall * devices) if wall and devices else None}

    def table(self) -> str:
        from ..display import format_time

        lines = [f"{'task':<4} {'workload':<44} {'layers':>6} {'trials':>9} {'default':>10} "
                 f"{'tuned':>10} {'GFLOP/s':>8} {'speedup':>7}"]
        for k, t in enumerate(self.tasks):
            shape = _describe(t.task)
            lines.append(
                f"{k:<4} {shape[:44]:<44} {getattr(t.task, 'layers', 1):>6} "
                f"{f'{t.resumed}+{t.measured}':>9} "
                f"{format_time(t.default_seconds) if t.default_seconds else '-':>10} "
                f"{format_time(t.best_seconds) if t.best_seconds else '-':>10} "
                f"{t.best_gflops:>8.1f} {f'{t.speedup:.2f}x' if t.speedup else '-':>7}")
        total = self.totals()
        idle = total["device_idle_fraction"]
        lines.append(f"{total['measured']} measured ({total['resumed']} from the log) in "
                     f"{total['wall_seconds']:.0f} s: {total['built']} built "
                     f"({total['built_per_second']:.2f}/s, {total['reused']} of them the same "
                     f"kernel as another's, {total['cached']} more from the build cache), "
                     f"{total['measured_per_second']:.2f} measured/s; devices held "
                     f"{total['held_seconds']:.0f} s, measuring {total['busy_seconds']:.0f} s: "
                     f"idle {'-' if idle is None else f'{idle:.0%}'} of the time held"
                     + ("" if total["measuring_share"] is None else
                        f", measuring {total['measuring_share']:.0%} of the run"))
        return "\n".join(lines)

    __str__ = table


def _describe(task) -> str:
    """``conv2d_nchw 1x64x56x56 w64x64x3x3`` for a layer's task, the arguments for another."""
    args = task.args
    if len(args) >= 2 and all(isinstance(a, (list, tuple)) for a in args[:2]):
        return f"{task.name} {'x'.join(map(str, args[0]))} w{'x'.join(map(str, args[1]))}"
    return f"{task.name} {', '.join(map(str, args))}"


def tune_tasks(tasks, n_trial: int, measure_option: dict, log_file, *, tuner: str = "ga",
               early_stopping: int | None = None, confirm: int = 3,
               seed: int | None = 0, overlap: int = 2,
               measure_alone: bool = False) -> NetworkTuning:
    """Tune each task up to ``n_trial`` configurations (those in ``log_file`` count), appending
    every new measurement to ``log_file``; ``confirm``: as ``Tuner.tune``'s, the default and
    that many of the fastest measured once more at the end of a task. ``overlap``: how many
    tasks tune at once (1: one after the other, each round's device taken as soon as its
    first candidate is built). ``measure_alone``: no build of the run goes on while one of its
    candidates is measured (one task at a time, a round's device taken once all its candidates
    are built), for devices that share the builds' cores (a fleet of this host): measured
    beside builds, a layer's default ran up to 17x slower than alone and tuning chose by
    that noise."""
    if tuner not in TUNERS:
        raise ValueError(f"unknown tuner {tuner!r}; choose one of {', '.join(TUNERS)}")
    if n_trial < 1:
        raise ValueError(f"n_trial must be at least 1, got {n_trial}")
    if overlap < 1:
        raise ValueError(f"overlap must be at least 1, got {overlap}")
    log_file = os.fspath(log_file)
    history = load_from_file(log_file) if os.path.exists(log_file) else []
    started = time.monotonic()
    builder = measure_option["builder"]
    executor = builder.executor
    if executor is None:
        from ..measure import default_executor
        executor = default_executor()
    option = {**measure_option, "builder": dataclasses.replace(builder, executor=executor)}
    callback = log_to_file(log_file)
    stop = threading.Event()
    overlapping = overlap > 1 and len(tasks) > 1 and not measure_alone

    def tune_one(k: int, task) -> TaskTuning:
        t0 = time.monotonic()
        search = TUNERS[tuner](task, seed=seed)
        resumed = search.load_history(history)
        todo = min(n_trial, len(task.config_space)) - resumed
        if todo > 0 and not stop.is_set():
            log.info("task %d/%d %s: %d of %d trials to measure", k + 1, len(tasks), task.name,
                     todo, n_trial)
            search.tune(todo, option, early_stopping=early_stopping, callbacks=[callback],
                        confirm=confirm, wait_for_builds=overlapping or measure_alone,
                        stop=stop)
        measured = sum(r["candidates"] for r in search.rounds)
        return TaskTuning(task, resumed, measured, search.default_seconds,
                          search.best_seconds if search.best_config is not None else None,
                          search.best_flops, time.monotonic() - t0, search.rounds)
    try:
        if not overlapping:
            rows = [tune_one(k, task) for k, task in enumerate(tasks)]
        else:
            rows = _in_threads(tune_one, tasks, overlap, stop)
    finally:
        if builder.executor is None:
            executor.shutdown(wait=False, cancel_futures=True)
    return NetworkTuning(rows, time.monotonic() - started)


def _in_threads(tune_one, tasks, overlap: int, stop: threading.Event) -> list:
    """``tune_one(k, task)`` of every task, ``overlap`` at a time, in the tasks' order. On an
    error or Ctrl-C no further task or round starts; the running rounds end first."""
    def guarded(k: int, task) -> TaskTuning:
        try:
            return tune_one(k, task)
        except BaseException:      # at once, not when the caller reaches this task's result
            stop.set()
            raise
    pool = concurrent.futures.ThreadPoolExecutor(overlap, thread_name_prefix="kernelrpc-tune")
    futures = [pool.submit(guarded, k, task) for k, task in enumerate(tasks)]
    try:
        return [future.result() for future in futures]
    except BaseException:
        stop.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
