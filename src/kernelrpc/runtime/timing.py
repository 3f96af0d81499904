"""The time_evaluator algorithm of TVM's ``runtime.RPCTimeEvaluator`` (src/runtime/timer.cc),
as a pure function over callables so tests can drive it with a counting fake clock.

Reference: ``docs/tvm-wire-formats.md`` section 6.2. Only ``run_batch`` (or ``run_repeats``)
touches the kernel's timing clock; the warm-up call, ``f_preproc`` and the cooldown sleeps are
never timed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

GOLDEN_RATIO = 1.618


@dataclass
class TimerState:
    """``number`` grows with ``min_repeat_ms`` and stays grown for later repeats and calls."""
    number: int


@dataclass(frozen=True)
class TimingConfig:
    repeat: int = 1
    min_repeat_ms: float = 0
    limit_zero_time_iterations: int = 100
    cooldown_interval_ms: float = 0
    repeats_to_cooldown: int = 1


def repeats_apart(config: TimingConfig) -> str | None:
    """Why the repeats of ``config`` need a call of ``run_batch`` each, or None when every repeat
    is exactly one batch of ``number`` calls with nothing between two of them (what
    ``measure_at_once`` needs)."""
    if config.min_repeat_ms > 0:
        return "min_repeat_ms times a repeat again when its batch ran too short"
    if config.cooldown_interval_ms > 0:
        return "cooldown_interval_ms sleeps between repeats"
    return None


def measure(state: TimerState, config: TimingConfig, *,
            warmup: Callable[[], None],
            run_batch: Callable[[int], int],
            preproc: Callable[[], None] | None = None,
            sleep: Callable[[float], None],
            resume: Callable[[], None] | None = None) -> list[float]:
    """Seconds per call for each repeat.

    ``warmup()`` calls the function once; ``run_batch(number)`` calls it ``number`` times and
    returns the elapsed nanoseconds; ``preproc()`` runs before each repeat; ``sleep(seconds)``
    is the cooldown; ``resume()`` runs right before the first batch and before the first batch
    after each cooldown (where a watcher of the timed stretches opens its window).
    """
    warmup()
    min_repeat_ms, limit = config.min_repeat_ms, config.limit_zero_time_iterations
    cooldown_s, repeats_to_cooldown = config.cooldown_interval_ms / 1e3, config.repeats_to_cooldown
    number = state.number
    results = []
    resumed = resume is None
    for i in range(config.repeat):
        if preproc is not None:
            preproc()
        duration_ms = 0.0
        zero_passes = 0
        while True:
            if duration_ms > 0.0:
                number = state.number = int(max(min_repeat_ms / (duration_ms / number) + 1,
                                                number * GOLDEN_RATIO))
            if not resumed:
                resume()
                resumed = True
            elapsed_ns = run_batch(number)
            if elapsed_ns == 0:
                zero_passes += 1
            duration_ms = elapsed_ns / 1e6
            if not (duration_ms < min_repeat_ms and zero_passes < limit):
                break
        results.append(duration_ms / 1e3 / number)
        if cooldown_s > 0 and i % repeats_to_cooldown == 0:
            sleep(cooldown_s)
            resumed = resume is None
    return results


def measure_at_once(state: TimerState, config: TimingConfig, *,
                    warmup: Callable[[], None],
                    run_repeats: Callable[[int], list[int]],
                    resume: Callable[[], None] | None = None) -> list[float]:
    """What ``measure`` returns for a ``config`` whose every repeat is one batch with nothing
    between two of them (``repeats_apart(config)`` is None) and without ``preproc``, from one
    ``run_repeats(number)`` that runs all ``config.repeat`` batches and returns the elapsed
    nanoseconds of each: the same calls, batches and results as ``measure`` makes of them."""
    reason = repeats_apart(config)
    if reason is not None:
        raise ValueError(f"measure_at_once cannot time these repeats: {reason}")
    warmup()
    number = state.number
    if resume is not None:
        resume()
    return [elapsed_ns / 1e6 / 1e3 / number for elapsed_ns in run_repeats(number)]
