"""``kernelrpc.measure``: build many candidates on the host, run them on every free device of a key.

Builds run on a ``concurrent.futures.Executor`` (a local process pool unless one is given, e.g.
``distributed.Client(...).get_executor()``); each finished build joins a work queue that one
thread per device drains, over one tracker session per device kept for the whole batch. Results
come back in the order they finish.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import socket
import sys
import threading
import time

import numpy as np

from ..errors import QueueTimeout, RPCError, TrackerError
from ..netutil import parse_host_port
from . import result as R
from .build import BuildOutput, LinkFiles, build_candidate, dumps_candidate
from .cache import BuildCache
from .device import DeviceSession, Requeue

log = logging.getLogger(__name__)

RETRY_PAUSE = 1.0
"""Seconds between attempts to reach a tracker or server that did not answer."""
TRACKER_GONE = 60.0
"""Seconds a device thread keeps trying to reach a tracker (or the servers it names) before it gives up."""
JOIN_TIMEOUT = 10.0
"""Seconds ``_finish`` waits for each device thread to end."""
QUEUE_POLL = 10.0
"""Seconds a device thread waits in the tracker's queue before it looks whether any server of
the key is still registered (a board held by someone else is waited for; a key with no board
left is given up after ``board_wait``)."""


@dataclasses.dataclass
class RunSpec:
    """How every candidate of a batch runs (shared by the device threads)."""

    name: str
    inputs: list
    reference: list | None
    number: int
    repeat: int
    min_repeat_ms: float
    timeout: float
    rtol: float
    atol: float
    flops: float | None


@dataclasses.dataclass
class Job:
    index: int
    name: str
    build: BuildOutput
    requeued: int = 0


class _WorkQueue:
    """Built candidates waiting for a device; ``get`` returns None once nothing more can come."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._builds_left = 0
        self._running = 0
        self.cancelled = False

    def expect(self, n: int) -> None:
        with self._cond:
            self._builds_left += n

    def put(self, job: Job | None) -> None:
        """A build finished: its job (or None for a failed build) and one fewer to come."""
        with self._cond:
            if job is not None:
                self._items.append(job)
            self._builds_left -= 1
            self._cond.notify_all()

    def pending_builds(self) -> int:
        with self._cond:
            return max(self._builds_left, 0)

    def requeue(self, job: Job) -> None:
        with self._cond:
            self._items.appendleft(job)
            self._running -= 1
            self._cond.notify_all()

    def done(self) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def _finished(self) -> bool:
        return self.cancelled or (not self._items and self._builds_left <= 0 and self._running <= 0)

    def wait_for_work(self, all_built: bool = False) -> bool:
        """Block until a job is ready (True) or the batch is over (False); ``all_built``: until
        every build of the batch has finished too (then nothing the device does waits for one)."""
        with self._cond:
            while not self._finished() and (not self._items or (all_built and self._builds_left > 0)):
                self._cond.wait()
            return bool(self._items) and not self.cancelled

    def get(self) -> Job | None:
        with self._cond:
            while not self._items and not self._finished():
                self._cond.wait()
            if self.cancelled or not self._items:
                return None
            self._running += 1
            return self._items.popleft()

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()


def _normalize(candidates) -> list[tuple[str, object]]:
    """``[(name, function)]`` from a dict, a list of pairs or a list of functions."""
    if isinstance(candidates, dict):
        items = list(candidates.items())
    else:
        items = [c if isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str)
                 else (getattr(c, "__name__", "").replace("<lambda>", ""), c) for c in candidates]
    for name, fn in items:
        if not callable(fn):
            raise TypeError(f"candidate {name!r} is not callable: a candidate is a function that "
                            "returns (schedule, args)")
    return [(name or f"candidate{i}", fn) for i, (name, fn) in enumerate(items)]


def _tracker_address(tracker) -> tuple[str, int]:
    if isinstance(tracker, str):
        try:
            return parse_host_port(tracker)
        except ValueError as exc:
            raise ValueError(f"tracker: {exc}") from None
    if hasattr(tracker, "addr"):
        return tuple(tracker.addr)
    host, port = tracker
    return str(host), int(port)


def _references(reference, inputs):
    if reference is None:
        return None
    out = reference(*[a.copy() for a in inputs]) if callable(reference) else reference
    if isinstance(out, np.ndarray):
        out = [out]
    return [np.asarray(a) for a in out]


def default_executor(max_workers: int | None = None) -> concurrent.futures.Executor:
    """A process pool sized to the cores this process may use; ``spawn``, so that no worker
    inherits the device threads or llvmlite's state."""
    if max_workers is None:
        max_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return concurrent.futures.ProcessPoolExecutor(max_workers=max_workers or 1,
                                                  mp_context=multiprocessing.get_context("spawn"))


def _interrupt(tracker) -> None:
    """Wake a thread blocked on this tracker connection (closing alone does not)."""
    sock = tracker._sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _progress_bar(total: int, enabled: bool | None):
    """A tqdm bar (a widget in Jupyter); by default only where someone watches: a terminal or a
    notebook. None when off or when tqdm is not installed."""
    if enabled is None:
        enabled = sys.stderr.isatty() or "ipykernel" in sys.modules
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        log.info("measure: no progress bar (pip install tqdm)")
        return None
    return tqdm(total=total, desc="measure", unit="candidate")


class MeasureBatch:
    """A running batch: iterate for results as they finish; ``results`` holds those seen so far.

    ``stats()`` reports builds per second, measurements per second and how much of the time
    the devices held by the batch sat idle.
    """

    def __init__(self, candidates, *, key: str, tracker, inputs, reference=None, target=None,
                 name: str = "main", number: int = 3, repeat: int = 3, min_repeat_ms: float = 0,
                 timeout: float = 60.0, session_timeout: float = 600.0, executor=None,
                 max_devices: int | None = None, flops: float | None = None, rtol: float = 1e-4,
                 atol: float = 1e-4, priority: int = 1, progress: bool | None = None,
                 sources=(), objects=(), build_cache: BuildCache | None = None,
                 wait_for_builds: bool = False, board_wait: float = 120.0) -> None:
        self.candidates = _normalize(candidates)
        self.link = LinkFiles(sources, objects)
        self.key = key
        self.tracker_addr = _tracker_address(tracker)
        self.target = None if target is None else str(target)
        inputs = [np.require(a, requirements="C") for a in inputs]  # ascontiguousarray: 0-d -> 1-d
        if timeout <= 0:
            raise ValueError("timeout must be positive (seconds per candidate on the device)")
        if session_timeout and session_timeout < timeout:
            raise ValueError("session_timeout must be at least the per-candidate timeout")
        self.spec = RunSpec(name, inputs, _references(reference, inputs), number, repeat,
                            min_repeat_ms, timeout, rtol, atol, flops)
        self.session_timeout = session_timeout
        self.priority = priority
        self.max_devices = max_devices
        self.progress = progress
        self.build_cache = build_cache
        self.wait_for_builds = wait_for_builds
        if board_wait <= 0:
            raise ValueError("board_wait must be positive (seconds without any server of the key)")
        self.board_wait = board_wait
        self.results: list[R.MeasureResult] = []
        self._executor = executor
        self._own_executor = executor is None
        self._queue = _WorkQueue()
        self._done: "collections.deque[R.MeasureResult]" = collections.deque()
        self._done_cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._devices: list[DeviceSession] = []
        self._waiting: set = set()                # tracker connections waiting in the queue
        self._waiting_lock = threading.Lock()
        self._errors: list[Exception] = []
        self._started = False
        self._start_time = self._end_time = 0.0
        self._build_seconds = 0.0
        self._built = 0
        self._cached = 0
        self._reused = 0
        self._last_built_at = 0.0

    # -- running ---------------------------------------------------------------------------

    def _start(self) -> None:
        self._started = True
        self._start_time = time.monotonic()
        devices = self._device_count()           # first: an unreachable tracker fails before any build
        if self._executor is None:
            self._executor = default_executor()
        self._queue.expect(len(self.candidates))
        shared = None if self.build_cache is None else self.build_cache.directory
        for index, (name, fn) in enumerate(self.candidates):
            key = None
            try:
                payload = dumps_candidate(fn)
                if self.build_cache is not None:
                    key = BuildCache.key(payload, self.target, self.spec.name, self.link or None)
                    cached = self.build_cache.get(key)
                    if cached is not None:
                        self._cached += 1
                        self._built_one(index, name, cached, fresh=False)
                        continue
                future = self._executor.submit(build_candidate, payload, self.target, self.spec.name,
                                               self.link or None, shared)
            except Exception as exc:  # cannot be pickled or submitted: this candidate's build error
                self._built_one(index, name, BuildOutput(None, [], 0.0, f"{type(exc).__name__}: {exc}"))
                continue
            future.add_done_callback(lambda f, i=index, n=name, k=key: self._build_finished(i, n, f, k))
        for _ in range(devices):
            thread = threading.Thread(target=self._device_loop, daemon=True,
                                      name=f"kernelrpc-measure-{self.key}")
            thread.start()
            self._threads.append(thread)

    def _registered_servers(self) -> int:
        """How many servers of the key the tracker has registered now."""
        from ..rpc.tracker_client import TrackerSession, count_servers

        with TrackerSession(self.tracker_addr) as tracker:
            return count_servers(tracker.summary()).get(self.key, 0)

    def _device_count(self) -> int:
        servers = self._registered_servers()
        if not servers:
            log.warning("no server with key %r at tracker %s:%s yet; waiting for one", self.key,
                        *self.tracker_addr)
        return max(1, min(servers, self.max_devices or servers or 1))

    def _build_finished(self, index: int, name: str, future, key: bytes | None = None) -> None:
        try:
            output = future.result()
        except BaseException as exc:  # the worker died or the executor could not run it
            output = BuildOutput(None, [], 0.0, f"{type(exc).__name__}: {exc}")
        else:                          # a worker that died says nothing of the input: not kept
            if key is not None:
                self.build_cache.put(key, output)
        self._built_one(index, name, output)

    def _built_one(self, index: int, name: str, output: BuildOutput, fresh: bool = True) -> None:
        """A candidate's build is in (``fresh``: built now, not taken from the cache)."""
        if fresh:
            self._build_seconds += output.seconds
            self._built += output.library is not None
            self._reused += output.reused
        self._last_built_at = time.monotonic()
        if output.library is None:
            self._deliver(R.MeasureResult(index, name, R.COMPILE_ERROR, error=output.error,
                                          detail=output.traceback, build_seconds=output.seconds,
                                          flops=self.spec.flops))
            self._queue.put(None)
        else:
            self._queue.put(Job(index, name, output))

    def _deliver(self, res: R.MeasureResult) -> None:
        with self._done_cond:
            self._done.append(res)
            self._done_cond.notify_all()

    def _open_session(self) -> DeviceSession | None:
        """Wait in the tracker's queue for a device of the key (as long as there is work for it)
        and open a session: a board that went away rejoins when it registers again, and the
        wait ends with an error once no server of the key has been registered for
        ``board_wait`` seconds. ``_finish`` breaks the wait by shutting the tracker connection."""
        from ..rpc.client import connect
        from ..rpc.tracker_client import TrackerSession

        failing_since = absent_since = None
        poll = min(QUEUE_POLL, self.board_wait)
        while self._queue.wait_for_work(all_built=self.wait_for_builds):
            tracker = None
            try:
                tracker = TrackerSession(self.tracker_addr)
                with self._waiting_lock:
                    self._waiting.add(tracker)
                if self._queue.cancelled:
                    return None
                host, port, matchkey = tracker.request_address(self.key, self.priority,
                                                               timeout=poll)
                session = connect(host, port, key=matchkey, session_timeout=self.session_timeout)
            except QueueTimeout:
                if self._queue.cancelled:
                    return None
                now = time.monotonic()
                try:
                    registered = self._registered_servers()
                except (TrackerError, OSError, RPCError):
                    continue                          # the next request says what became of it
                absent_since = None if registered else absent_since or now - poll
                if absent_since is not None and now - absent_since >= self.board_wait:
                    raise TrackerError(f"no server with key {self.key!r} registered at the "
                                       f"tracker for {now - absent_since:.0f} s") from None
                continue
            except (TrackerError, OSError, RPCError) as exc:
                if self._queue.cancelled:
                    return None
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > TRACKER_GONE:
                    raise TrackerError(f"no session for key {self.key!r} for {TRACKER_GONE:g} s: "
                                       f"{exc}") from exc
                log.warning("measure: no session for key %r yet: %s", self.key, exc)
                time.sleep(RETRY_PAUSE)
                continue
            finally:
                if tracker is not None:
                    with self._waiting_lock:
                        self._waiting.discard(tracker)
                    tracker.close()
            failing_since = None
            try:
                return DeviceSession(session, self.spec.inputs, self.session_timeout)
            except (RPCError, OSError) as exc:
                log.warning("measure: session with %s failed at the start: %s", session.address, exc)
                session.close()
        return None

    def _device_loop(self) -> None:
        device = None
        try:
            while True:
                if device is None or not device.alive or not device.has_time_for(self.spec.timeout):
                    if device is not None:
                        device.close()
                    device = self._open_session()
                    if device is None:
                        return
                    self._devices.append(device)
                job = self._queue.get()
                if job is None:
                    return
                try:
                    res = device.run(job, self.spec)
                except Requeue as exc:
                    job.requeued += 1
                    if job.requeued <= 2:
                        log.info("measure: candidate %s goes back to the queue: %s", job.name, exc)
                        self._queue.requeue(job)
                        continue
                    res = R.MeasureResult(job.index, job.name, exc.status, error=str(exc),
                                          device=device.address, flops=self.spec.flops)
                except Exception as exc:  # a bug must cost this candidate only, not hang the batch
                    log.exception("measure: candidate %s", job.name)
                    res = R.MeasureResult(job.index, job.name, R.RUNTIME_ERROR,
                                          error=f"{type(exc).__name__}: {exc}", device=device.address,
                                          flops=self.spec.flops)
                self._deliver(res)
                self._queue.done()
        except Exception as exc:
            log.exception("measure: device thread failed")
            self._errors.append(exc)
        finally:
            if device is not None:
                device.close()
            with self._done_cond:
                self._done_cond.notify_all()

    # -- consuming -------------------------------------------------------------------------

    def __iter__(self):
        """Results as they finish. Leaving the loop early stops the batch and releases the devices."""
        if not self._started:
            self._start()
        seen = len(self.results)
        yield from self.results[:seen]
        bar = _progress_bar(len(self.candidates), self.progress) if seen < len(self.candidates) else None
        if bar is not None:
            bar.update(seen)
        try:
            while len(self.results) < len(self.candidates) and not self._queue.cancelled:
                with self._done_cond:
                    while not self._done:
                        if not any(t.is_alive() for t in self._threads) and not self._done:
                            self._fail_remaining()
                            break
                        self._done_cond.wait(1.0)
                    batch = list(self._done)
                    self._done.clear()
                for res in batch:
                    self.results.append(res)
                    if bar is not None:
                        best = self.best()
                        bar.set_postfix_str(f"best {best.summary()}" if best else "", refresh=False)
                        bar.update(1)
                    yield res
        finally:   # all seen, or the caller stopped early (break, an exception, Ctrl-C): release devices
            if bar is not None:
                bar.close()
            self._finish()

    def _fail_remaining(self) -> None:
        """Every device thread ended with work left (the tracker went away): say so per candidate."""
        reported = {r.index for r in self.results} | {r.index for r in self._done}
        why = f"no device: {self._errors[-1]}" if self._errors else "no device could be reached"
        for index, (name, _) in enumerate(self.candidates):
            if index not in reported:
                self._done.append(R.MeasureResult(index, name, R.RUNTIME_ERROR, error=why))

    def _finish(self) -> None:
        if self._end_time:
            return
        self._end_time = time.monotonic()
        stopped_early = len(self.results) < len(self.candidates)
        self._queue.cancel()
        with self._waiting_lock:
            waiting = list(self._waiting)
        for tracker in waiting:                    # leave the tracker's queue now
            _interrupt(tracker)
        if stopped_early:
            for device in list(self._devices):
                device.abort()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def wait(self) -> list[R.MeasureResult]:
        """Run the batch to the end; every result, in candidate order."""
        for _ in self:
            pass
        return sorted(self.results, key=lambda r: r.index)

    def close(self) -> None:
        """Stop early: devices are released, unfinished candidates are dropped."""
        self._queue.cancel()
        self._finish()

    def __enter__(self) -> "MeasureBatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def best(self) -> R.MeasureResult | None:
        ok = [r for r in self.results if r.ok]
        return min(ok, key=lambda r: r.profile.median, default=None)

    def stats(self) -> dict:
        """Throughput and device idleness of the batch so far (wall-clock seconds; ``built``
        counts the builds run, ``reused`` those of them that found their kernel in the build
        cache's directory, ``cached`` the candidates not built at all; a device's
        ``opened_after`` and ``builds_done_after``, when the last build finished, count from
        the batch's start)."""
        end = self._end_time or time.monotonic()
        wall = max(end - self._start_time, 1e-9) if self._started else 0.0
        held = sum((d.closed_at or end) - d.opened_at for d in self._devices)
        busy = sum(d.busy for d in self._devices)
        counts = collections.Counter(r.status for r in self.results)
        return {"candidates": len(self.candidates), "wall_seconds": wall,
                "built": self._built, "cached": self._cached, "reused": self._reused,
                "built_per_second": self._built / wall if wall else 0.0,
                "build_seconds_total": self._build_seconds,
                "measured_per_second": sum(d.count for d in self._devices) / wall if wall else 0.0,
                "builds_done_after": self._last_built_at - self._start_time
                if self._last_built_at and not self._queue.pending_builds() else None,
                "devices": [{"address": d.address, "cpus": d.cpus, "measured": d.count,
                             "busy_seconds": d.busy, "held_seconds": (d.closed_at or end) - d.opened_at,
                             "opened_after": d.opened_at - self._start_time}
                            for d in self._devices],
                "device_idle_fraction": 1 - busy / held if held > 0 else None,
                "statuses": dict(counts)}

    # -- rendering -------------------------------------------------------------------------

    def _caption(self) -> str:
        counts = collections.Counter(r.status for r in self.results)
        parts = [f"{counts[s]} {s}" for s in R.STATUSES if counts[s]]
        return (f"{len(self.results)} of {len(self.candidates)} candidates measured on key "
                f"{self.key!r}" + (f": {', '.join(parts)}" if parts else ""))

    def __repr__(self) -> str:
        return f"<MeasureBatch {self._caption()}>"

    def __str__(self) -> str:
        ordered = sorted(self.results, key=lambda r: r.index)
        return self._caption() + "\n" + R.text_table(ordered)

    def _repr_html_(self) -> str:
        return R.html_table(sorted(self.results, key=lambda r: r.index), self._caption())


def measure(candidates, *, key: str, tracker, inputs, reference=None, **options) -> MeasureBatch:
    """Build many candidate schedules on the host and measure them on every free device of ``key``.

    Args:
        candidates: functions returning ``(schedule, args)`` (a list, a list of ``(name, fn)``
            pairs or a dict of name to function); closures and lambdas are fine (cloudpickle).
        key: the device key at the tracker.
        tracker: ``"host:port"`` (``"[::1]:9190"`` for an IPv6 address), a ``(host, port)`` pair
            or a ``TrackerSession``.
        inputs: arrays for the leading arguments; the remaining ones are outputs, allocated from
            the built function's signature.
        reference: the expected outputs (an array or a list of them), or a function of the inputs
            that returns them; ``None`` skips the check.
        options: ``target``, ``name`` (function name), ``number``, ``repeat``, ``min_repeat_ms``,
            ``timeout`` (seconds per candidate on a device), ``session_timeout``, ``executor``
            (any ``concurrent.futures.Executor``), ``max_devices``, ``flops`` (per call, for
            GFLOP/s), ``rtol``/``atol``, ``priority``, ``progress`` (a tqdm bar; default: on in a
            terminal or a notebook), ``sources``/``objects`` (C files and objects every candidate
            links, as in ``kernelrpc.build``: for kernels that call C functions with
            ``tir.call_extern``), ``build_cache`` (a :class:`~kernelrpc.measure.cache.BuildCache`:
            a candidate built before from the same input is not built again), ``wait_for_builds``
            (request the devices only once every candidate is built, so that no device is held
            while it waits for builds: for callers that build a batch while another measures),
            ``board_wait`` (seconds the batch goes on without any server of the key registered
            at the tracker, default 120: a board that went away or rebooted rejoins within it;
            its candidate in flight runs again on the next board).

    Returns:
        A :class:`MeasureBatch`: iterate it for :class:`MeasureResult` objects as they finish, or
        call ``wait()`` for all of them.
    """
    return MeasureBatch(candidates, key=key, tracker=tracker, inputs=inputs, reference=reference,
                        **options)
