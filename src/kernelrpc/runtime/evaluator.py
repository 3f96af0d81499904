"""time_evaluator on a local module: TVM's algorithm (timing.py) around the module's native
``__kernelrpc_time`` loop, with the device's conditions (conditions.py) read around the timed
batches (outside their native clock).

Where every repeat is one batch with nothing between two of them (no ``min_repeat_ms``,
cooldown, ``f_preproc`` or ``cache_flush_bytes``), all the repeats are one call of the module's
``__kernelrpc_time_repeats``, which times each batch as ``__kernelrpc_time`` does; a module
without it (built by an older kernelrpc) gets a call per batch, which is logged at debug with
the reason (``TimeEvaluator.per_batch_reason``)."""
from __future__ import annotations

import ctypes
import functools
import logging
import operator
import time

from .buffer import AlignedBuffer
from .cacheflush import ScratchFlusher
from .conditions import default_probe
from .device import Device
from .profile import MAX_RESULTS, ProfileResult
from .timing import TimerState, TimingConfig, measure, measure_at_once, repeats_apart

log = logging.getLogger(__name__)

CACHE_FLUSH_NON_FIRST_ARG = "cache_flush_cpu_non_first_arg"
F_PREPROC_NAMES = ("", CACHE_FLUSH_NON_FIRST_ARG)
MAX_NUMBER = (1 << 31) - 1
MAX_INTERVAL_MS = 3_600_000
MAX_CACHE_FLUSH_BYTES = 1 << 32


def _bounded_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"time_evaluator: {name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"time_evaluator: {name} must be an integer, "
                        f"got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ValueError(f"time_evaluator: {name} must be in [{lo}, {hi}], got {value}")
    return value


def _bounded_ms(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"time_evaluator: {name} must be a number of milliseconds, got {value!r}")
    if not 0 <= value <= MAX_INTERVAL_MS:
        raise ValueError(f"time_evaluator: {name} must be in [0, {MAX_INTERVAL_MS}], got {value}")
    return value


def _cooldown(measurement, seconds: float) -> None:
    measurement.pause()
    time.sleep(seconds)


class TimeEvaluator:
    """Calling it with the function's arguments returns a ProfileResult. Like TVM's timer, it
    keeps ``number`` once min_repeat_ms has grown it, for later repeats and later calls."""

    def __init__(self, function, dev, *, number=10, repeat=1, min_repeat_ms=0,
                 cooldown_interval_ms=0, repeats_to_cooldown=1, f_preproc="",
                 limit_zero_time_iterations=100, cache_flush_bytes=0):
        if not isinstance(dev, Device) or not dev.is_local:
            raise ValueError(f"time_evaluator of a local module needs a local device, got {dev!r}")
        if f_preproc not in F_PREPROC_NAMES:
            raise ValueError(f"time_evaluator: unknown f_preproc {f_preproc!r}; "
                             f"supported: {', '.join(repr(n) for n in F_PREPROC_NAMES)}")
        self.function = function
        self.device = dev
        self.f_preproc = f_preproc
        self._state = TimerState(_bounded_int("number", number, 1, MAX_NUMBER))
        self.config = TimingConfig(
            repeat=_bounded_int("repeat", repeat, 1, MAX_RESULTS),
            min_repeat_ms=_bounded_ms("min_repeat_ms", min_repeat_ms),
            limit_zero_time_iterations=_bounded_int("limit_zero_time_iterations",
                                                    limit_zero_time_iterations, 0, MAX_NUMBER),
            cooldown_interval_ms=_bounded_ms("cooldown_interval_ms", cooldown_interval_ms),
            repeats_to_cooldown=_bounded_int("repeats_to_cooldown", repeats_to_cooldown, 1,
                                             MAX_NUMBER),
        )
        self.cache_flush_bytes = _bounded_int("cache_flush_bytes", cache_flush_bytes, 0,
                                              MAX_CACHE_FLUSH_BYTES)
        self._flush_buffers: tuple[AlignedBuffer, AlignedBuffer] | None = None
        self._scratch = ScratchFlusher()
        self._probe = default_probe()
        #: Why each batch is a native call of its own, or None when all the repeats are one call.
        self.per_batch_reason = self._per_batch_reason()
        self._time_repeats = None
        if self.per_batch_reason is not None:
            log.debug("time_evaluator of %s: a native call per batch, because %s", function.name,
                      self.per_batch_reason)
        elif function is not None:      # (warm_up() has none)
            self._time_repeats = function.module.repeats_timer(function, self.config.repeat)

    def _per_batch_reason(self) -> str | None:
        reason = repeats_apart(self.config)
        if reason is None and self.f_preproc:
            reason = f"f_preproc {self.f_preproc!r} runs before each repeat"
        if reason is None and self.cache_flush_bytes:
            reason = "cache_flush_bytes flushes the caches before each batch"
        if reason is None and self.function is not None and not self.function.module.has_repeats_timer:
            reason = (f"{self.function.module.path} has no __kernelrpc_time_repeats (a module "
                      "built by an older kernelrpc, or not by kernelrpc)")
        return reason

    @property
    def number(self) -> int:
        """The current ``number`` (calls per timed batch), grown by min_repeat_ms if needed."""
        return self._state.number

    def __call__(self, *args) -> ProfileResult:
        results, conditions = self.run(*args)
        function = self.function
        return ProfileResult(results, self._state.number, function.module.target, function.name,
                             conditions)

    def run(self, *args) -> tuple[list[float], dict]:
        """The seconds per call of every repeat and the conditions dict, without the
        ProfileResult (what the packed wire form sends); ``number`` is read after it."""
        function = self.function
        packed = function.pack(args)
        if self._time_repeats is not None:
            measurement = self._probe.measurement()
            results = measure_at_once(self._state, self.config,
                                      warmup=functools.partial(function.invoke, packed),
                                      run_repeats=functools.partial(self._time_repeats, packed),
                                      resume=measurement.batch_started)
            return results, measurement.report()
        module = function.module
        flush_buffers = self._cache_flush_buffers()
        time_batch = module.batch_timer(function, packed)
        if flush_buffers is None:
            run_batch = time_batch
        else:
            def run_batch(number: int) -> int:
                src, dst = flush_buffers
                ctypes.memmove(dst.address, src.address, dst.nbytes)
                return time_batch(number)
        preproc = None
        if self.f_preproc == CACHE_FLUSH_NON_FIRST_ARG:
            preproc = functools.partial(self._flush_non_first, packed)
        measurement = self._probe.measurement()
        results = measure(self._state, self.config, warmup=functools.partial(function.invoke, packed),
                          run_batch=run_batch, preproc=preproc,
                          sleep=functools.partial(_cooldown, measurement),
                          resume=measurement.batch_started)
        return results, measurement.report()

    def _cache_flush_buffers(self):
        """TVM's cache_flush_bytes: two int32 buffers; copying one into the other before every
        timed batch evicts the caches."""
        if self.cache_flush_bytes and self._flush_buffers is None:
            size = self.cache_flush_bytes // 4 * 4
            self._flush_buffers = (AlignedBuffer(size), AlignedBuffer(size))
        return self._flush_buffers

    def _flush_non_first(self, packed) -> None:
        module = self.function.module
        tensors = [tensor for position, tensor in packed.tensors if position > 0]
        if not module.has_cache_flush:
            if tensors:
                self._scratch.flush()
            return
        for tensor in tensors:
            module.cache_flush(tensor)

    def __repr__(self) -> str:
        return (f"<TimeEvaluator {self.function.name} number={self.number} "
                f"repeat={self.config.repeat} min_repeat_ms={self.config.min_repeat_ms}>")


def warm_up(number: int = 100, repeat: int = 20) -> tuple[int, list[float], dict]:
    """A time_evaluator's run without a kernel: a TimeEvaluator set up, the timing loop over
    batches that take no time, the default probe's real measurement around them. Returns what
    a packed result carries, ``(number, results, conditions)``. A forked session child calls it
    before its client arrives (server/spare.py), so that the first time_evaluator of the session
    finds these pages its own."""
    timer = TimeEvaluator(None, Device(1, 0), number=number, repeat=repeat)
    measurement = timer._probe.measurement()
    results = measure_at_once(timer._state, timer.config, warmup=lambda: None,
                              run_repeats=lambda n: [n] * repeat, resume=measurement.batch_started)
    return timer.number, results, measurement.report()
