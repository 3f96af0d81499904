"""What the device saw while a measurement ran, so a reader can tell a clean number from a
disturbed one.

A :class:`Measurement` (from ``ConditionsProbe.measurement()``) follows one time_evaluator
call: it reads the CPU counters when the timed batches start and when they end (outside the
batches' own native clock; cooldown sleeps are left out) and the threads and frequencies at
the start and the end, and reports, as a plain JSON-able dict:

* ``wall_s``: the length of that window, which everything below refers to.
* ``other_cpu_s``: CPU time that *other* processes used on the CPUs this process may run on,
  during the window: the busy time of those CPUs in ``/proc/stat`` minus this process's
  own CPU time (``own_cpu_s``, from ``getrusage`` in microseconds; ``os.times`` would count in
  ticks). ``/proc/stat`` counts in clock ticks (``clock_tick_s``, usually 10 ms), so short
  measurements carry up to a tick of uncertainty per CPU.
* ``other_load``: that time as a fraction of the CPUs' capacity over the measurement
  (``other_cpu_s / (wall_s * len(cpus))``).
* ``preempted``: involuntary context switches of this process (``getrusage``): how often the
  scheduler took a CPU away from the timed threads.
* ``freq_mhz``: the lowest and highest ``scaling_cur_freq`` of those CPUs seen at either
  snapshot, where the device exposes cpufreq (``None`` where it does not, e.g. most VMs).
* ``threads``: the threads of this process that ran during the measurement (the caller and
  the module's pool) between the start and the end: native thread id, the CPU it ran on
  last, and its CPU time.

Standard library only (it runs on devices); every reader degrades to ``None`` on a system
without the file it reads.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref

try:
    import resource
except ImportError:  # not POSIX
    resource = None

MAX_CPUS = 4096
MAX_THREADS = 4096
MAX_CPU_NUMBER = 1 << 20     # CPU numbers are below it
MAX_TID = (1 << 32) - 1
MAX_COUNT = (1 << 63) - 1    # preempted

#: Fields of a conditions dict and the type each holds (None allowed for all but wall_s/cpus).
FIELDS = {"wall_s": float, "cpus": list, "own_cpu_s": float, "other_cpu_s": float,
          "other_load": float, "preempted": int, "freq_mhz": list, "threads": list,
          "clock_tick_s": float}


#: How long the absence of a CPU's cpufreq file is believed before it is looked for again.
REDISCOVER_S = 10.0
#: Files a probe keeps open at most (a process with many threads must not run out of descriptors
#: because of it); the others are opened for each read.
MAX_KEPT_FILES = 64
_STAT_LINE_BYTES = 256  # longest ``cpuN`` line of /proc/stat (ten 20-digit counters)
#: Linux's clock id of a thread's CPU time is ``~tid << 3 | 6`` (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED,
#: what glibc's pthread_getcpuclockid returns): the thread's run time in nanoseconds.
_THREAD_SCHED_CLOCK = 6


def _has_thread_clocks() -> bool:
    """Whether this system reads a thread's CPU time by its clock id (Linux)."""
    if not hasattr(time, "clock_gettime_ns") or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        return abs(time.clock_gettime_ns((~tid << 3) | _THREAD_SCHED_CLOCK) - time.thread_time_ns()) < 1e9
    except (OSError, AttributeError):
        return False


class _Files:
    """procfs and sysfs files kept open and re-read with ``pread`` at offset 0, which makes the
    kernel produce the current contents again: opening a file costs several times the read.

    A forked child must not keep what it inherited (``/proc/self`` then still names the parent):
    right after ``os.fork`` it closes them (an at-fork hook, before anything in the child can
    close those numbers and reuse them for files of its own); after a fork that ran no hooks it
    only forgets them (``check_fork``, at the start of each measurement), since their numbers may
    name other files by then."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._pid = os.getpid()
        _ALL_FILES.add(self)

    def _forked(self) -> None:
        self._fds.clear()
        self._pid = os.getpid()

    def check_fork(self) -> None:
        """Forget the files if this is a child forked without the at-fork hooks (they would
        name the parent's): called once per measurement rather than at every read, a
        ``getpid`` each."""
        if self._pid != os.getpid():
            self._forked()

    def read(self, path: str, size: int = 4096) -> bytes | None:
        fd = self._fds.get(path)
        if fd is not None:
            try:
                return os.pread(fd, size, 0)
            except OSError:   # the thread behind /proc/self/task/N ended (its number may be reused)
                self.forget(path)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        if len(self._fds) >= MAX_KEPT_FILES:
            try:
                return os.pread(fd, size, 0)
            except OSError:
                return None
            finally:
                os.close(fd)
        kept = self._fds.setdefault(path, fd)
        if kept != fd:              # another thread opened it meanwhile
            os.close(fd)
        try:
            return os.pread(kept, size, 0)
        except OSError:
            self.forget(path)
            return None

    def links(self, path: str) -> int | None:
        """The link count of the directory ``path`` (kept open like the files): for
        ``/proc/self/task`` it is the number of threads plus two, a ``fstat`` instead of a listing."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return None
            kept = self._fds.setdefault(path, fd)
            if kept != fd:
                os.close(fd)
                fd = kept
        try:
            return os.fstat(fd).st_nlink
        except OSError:
            self.forget(path)
            return None

    def forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for path in list(self._fds):
            self.forget(path)

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():
                self.close()
        except Exception:   # interpreter shutdown
            pass


_ALL_FILES: weakref.WeakSet = weakref.WeakSet()


def _close_inherited_files() -> None:
    for files in list(_ALL_FILES):
        for fd in files._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        files._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_files)


def _sched_getcpu():
    """libc's ``sched_getcpu`` (the CPU the calling thread runs on), or None without it."""
    try:
        import ctypes

        getcpu = ctypes.CDLL(None).sched_getcpu
    except (ImportError, OSError, AttributeError):
        return None
    getcpu.restype, getcpu.argtypes = ctypes.c_int, ()
    return getcpu


class ConditionsProbe:
    """Reads the state of the CPUs this process may use; ``proc`` and ``sys_cpu`` name the
    roots of procfs and of ``/sys/devices/system/cpu`` (other roots serve tests and containers).

    The files it reads stay open between measurements (:class:`_Files`), so one probe per
    process (:func:`default_probe`) serves every time_evaluator. Every value is still read at
    every snapshot: only the absence of a cpufreq file (most VMs) is remembered, for
    :data:`REDISCOVER_S` seconds.
    """

    def __init__(self, proc: str = "/proc", sys_cpu: str = "/sys/devices/system/cpu") -> None:
        self.proc = proc
        self.sys_cpu = sys_cpu
        try:
            self.tick = 1.0 / os.sysconf("SC_CLK_TCK")
        except (AttributeError, ValueError, OSError):
            self.tick = 0.01
        self._files = _Files()
        self._stat_path = os.path.join(proc, "stat")
        self._task_dir = os.path.join(proc, "self", "task")
        self._task_paths: dict[int, tuple[str, str]] = {}   # tid -> its schedstat and stat
        self._tids: list[int] = []      # the threads listed last
        self._clocks: list[tuple[int, int]] = []    # and their CPU-time clocks' ids
        self._own_threads = proc == "/proc" and _has_thread_clocks()
        self._getcpu = _sched_getcpu() if self._own_threads else None
        self._stat_names: tuple[list[int], frozenset] = ([], frozenset())  # cpus, their lines' names
        self._stat_memo: tuple[list[int], bytes | None, int | None] = ([], None, None)  # cpus, lines, busy
        self._freq_paths: dict[int, str] = {}
        self._no_cpufreq: dict[int, float] = {}     # cpu -> when its cpufreq file was missing
        self._no_cpufreq_at_all: tuple[list[int], float] = ([], -math.inf)  # cpus none of which has one, since

    def measurement(self) -> Measurement:
        """Start following one measurement (call it before the warm-up)."""
        return Measurement(self)

    @staticmethod
    def _cpus() -> list[int]:
        try:
            return sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return list(range(os.cpu_count() or 1))

    def _busy_ticks(self, cpus: list[int]) -> int | None:
        """Non-idle ticks of ``cpus`` (sorted), from the ``cpuN`` lines of /proc/stat: they come
        first, after the line of all CPUs, each at most at line N + 1, so only that much of the
        file is read. The counters move in clock ticks, far apart next to a time_evaluator
        call, so the lines read last time and their sum are kept: lines that did not change
        are not split and parsed again."""
        last = cpus[-1]
        data = self._files.read(self._stat_path, _STAT_LINE_BYTES * (last + 2))
        if data is None:
            return None
        end = data.find(b"\n")
        start = end + 1
        for _ in range(last + 1):
            end = data.find(b"\n", end + 1)
            if end < 0:
                end = len(data)
                break
        lines = data[start:end]
        memo = self._stat_memo
        if lines == memo[1] and cpus == memo[0]:
            return memo[2]
        busy = self._parse_busy(cpus, lines)
        self._stat_memo = (list(cpus), lines, busy)
        return busy

    def _parse_busy(self, cpus: list[int], lines: bytes) -> int | None:
        if self._stat_names[0] != cpus:
            self._stat_names = (list(cpus), frozenset(b"cpu%d" % c for c in cpus))
        names = self._stat_names[1]
        busy = 0
        found = False
        for line in lines.split(b"\n"):
            fields = line.split(None, 9)
            if fields and fields[0] in names:
                # user nice system idle iowait irq softirq steal [guest guest_nice: in user]
                values = [*map(int, fields[1:9])]
                busy += sum(values) - sum(values[3:5])
                found = True
        return busy if found else None

    def _frequencies(self, cpus: list[int]) -> list[int]:
        now = time.monotonic()
        none_since = self._no_cpufreq_at_all
        if now - none_since[1] < REDISCOVER_S and cpus == none_since[0]:
            return []
        freqs = []
        for cpu in cpus:
            missing_since = self._no_cpufreq.get(cpu)
            if missing_since is not None and now - missing_since < REDISCOVER_S:
                continue
            path = self._freq_paths.get(cpu)
            if path is None:
                path = self._freq_paths[cpu] = os.path.join(self.sys_cpu, f"cpu{cpu}", "cpufreq",
                                                            "scaling_cur_freq")
            data = self._files.read(path)
            if data is None:
                self._no_cpufreq[cpu] = now
            elif data.strip().isdigit():
                self._no_cpufreq.pop(cpu, None)
                freqs.append(int(data))
        if not freqs and all(cpu in self._no_cpufreq for cpu in cpus):
            self._no_cpufreq_at_all = (list(cpus), min(self._no_cpufreq[cpu] for cpu in cpus))
        return freqs

    def _thread_times(self) -> dict[int, float]:
        """tid -> CPU seconds so far, for every thread of this process. The threads are listed
        again only when their number changed or one of those listed last time has ended (a
        ``fstat`` of the task directory instead of reading it)."""
        tids = self._tids
        if self._files.links(self._task_dir) == len(tids) + 2:
            if self._own_threads:   # the common case in one loop: each listed thread's clock
                times = {}
                try:
                    for tid, clock in self._clocks:
                        times[tid] = time.clock_gettime_ns(clock) / 1e9
                    return times
                except OSError:     # a thread has ended
                    pass
            else:
                times = self._times_of(tids)
                if len(times) == len(tids):
                    return times
        try:
            names = os.listdir(self._task_dir)
        except OSError:
            names = []
        self._tids = tids = [int(name) for name in names[:MAX_THREADS] if name.isdigit()]
        self._clocks = [(tid, (~tid << 3) | _THREAD_SCHED_CLOCK) for tid in tids]
        for gone in self._task_paths.keys() - set(tids):
            for path in self._task_paths.pop(gone):
                self._files.forget(path)
        return self._times_of(tids)

    def _times_of(self, tids: list[int]) -> dict[int, float]:
        """CPU seconds of each thread in ``tids`` that is still there: its CPU-time clock (the
        run time schedstat shows, without a file) for this process's own threads, else
        schedstat, else utime + stime from its stat file."""
        times = {}
        if self._own_threads:
            for tid in tids:
                try:
                    times[tid] = time.clock_gettime_ns((~tid << 3) | _THREAD_SCHED_CLOCK) / 1e9
                except OSError:     # the thread has ended
                    pass
            return times
        for tid in tids:
            schedstat = self._files.read(self._paths_of(tid)[0])
            if schedstat and schedstat.split()[0].isdigit():
                times[tid] = int(schedstat.split()[0]) / 1e9   # exact run time where available
                continue
            fields = self._stat_fields(tid)
            try:
                times[tid] = (int(fields[11]) + int(fields[12])) * self.tick  # utime + stime
            except (IndexError, ValueError):
                continue
        return times

    def _last_cpu(self, tid: int, caller: int) -> int | None:
        """The CPU thread ``tid`` ran on last (field 39 of its stat, "processor"); for the
        calling thread (``caller``) that is the CPU it runs on, which ``sched_getcpu`` tells
        without a file."""
        if self._getcpu is not None and tid == caller:
            cpu = self._getcpu()
            if cpu >= 0:
                return cpu
        try:
            return int(self._stat_fields(tid)[36])
        except (IndexError, ValueError):
            return None

    def _stat_fields(self, tid: int) -> list[bytes]:
        """The fields of /proc/self/task/TID/stat after the parenthesised command name, which
        may hold spaces."""
        stat = self._files.read(self._paths_of(tid)[1])
        return [] if stat is None else stat[stat.rfind(b")") + 2:].split()

    def _paths_of(self, tid: int) -> tuple[str, str]:
        paths = self._task_paths.get(tid)
        if paths is None:
            task = os.path.join(self._task_dir, str(tid))
            paths = self._task_paths[tid] = (os.path.join(task, "schedstat"), os.path.join(task, "stat"))
        return paths

    def _usage(self) -> tuple[float, int | None]:
        """This process's CPU seconds (all threads) and involuntary context switches."""
        if resource is None:
            return time.process_time(), None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime, usage.ru_nivcsw


_DEFAULT: ConditionsProbe | None = None


def default_probe() -> ConditionsProbe:
    """The probe of the real /proc and sysfs that this process's time_evaluators share."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = ConditionsProbe()
    return _DEFAULT


def warm_up(rounds: int = 20) -> None:
    """Run the default probe's measurements a few times, results dropped: a process that forks
    a child per session calls it before the first fork, so that each child finds the probe set
    up and its code specialized by the interpreter (about 0.1 ms off the first time_evaluator of
    each session, docs/performance.md). A forked child closes the files it opened (_Files)."""
    probe = default_probe()
    for _ in range(rounds):
        measurement = probe.measurement()
        measurement.batch_started()
        measurement.report()


class Measurement:
    """One time_evaluator call: the threads and the CPU frequency at its start and its end, and
    the CPU accounting of the window from its first timed batch (``batch_started``) to the end
    (``report``). The window closes for cooldown sleeps (``pause``) and opens again at the next
    batch, so the warm-up call and the sleeps do not count. /proc/stat is read only when the
    window opens or closes: the kernel generates the whole file for every read (about 10 µs),
    too much to do around every batch."""

    def __init__(self, probe: ConditionsProbe) -> None:
        self.probe = probe
        probe._files.check_fork()
        self.cpus = probe._cpus()
        self._threads = probe._thread_times()
        self._freqs = probe._frequencies(self.cpus)
        self.wall = self.own = 0.0
        self.busy: int | None = 0
        self.preempted: int | None = 0
        self._opened = None

    def batch_started(self) -> None:
        if self._opened is None:
            probe = self.probe
            busy = probe._busy_ticks(self.cpus)
            own, nivcsw = probe._usage()
            self._opened = busy, own, nivcsw, time.monotonic()

    def pause(self) -> None:
        if self._opened is None:
            return
        now = time.monotonic()
        own, nivcsw = self.probe._usage()
        busy = self.probe._busy_ticks(self.cpus)
        busy0, own0, nivcsw0, then = self._opened
        self._opened = None
        self.wall += now - then
        self.own += max(own - own0, 0.0)
        self.busy = None if None in (busy, busy0, self.busy) else self.busy + busy - busy0
        self.preempted = (None if None in (nivcsw, nivcsw0, self.preempted)
                          else self.preempted + max(nivcsw - nivcsw0, 0))

    def report(self) -> dict:
        """The conditions dict (see the module docstring); call it after the last batch."""
        self.pause()
        probe = self.probe
        wall = max(self.wall, 1e-9)
        other = load = None
        if self.busy is not None:
            other = max(self.busy * probe.tick - self.own, 0.0)
            load = other / (wall * len(self.cpus))
        freqs = [*self._freqs, *probe._frequencies(self.cpus)]
        return {
            "wall_s": wall,
            "cpus": list(self.cpus),
            "own_cpu_s": self.own,
            "other_cpu_s": other,
            "other_load": load,
            "preempted": self.preempted,
            "freq_mhz": [min(freqs) / 1e3, max(freqs) / 1e3] if freqs else None,
            "threads": _threads_that_ran(probe, self._threads, probe._thread_times()),
            "clock_tick_s": probe.tick,
        }


def _threads_that_ran(probe: ConditionsProbe, start: dict[int, float],
                      end: dict[int, float]) -> list[dict]:
    ran = []
    caller = threading.get_native_id()
    for tid, seconds in sorted(end.items()):
        used = seconds - start.get(tid, 0.0)
        if used > 0:
            ran.append({"tid": tid, "cpu": probe._last_cpu(tid, caller), "cpu_s": used})
    return ran


def check_conditions(data) -> dict | None:
    """A conditions dict from the network, checked field by field (unknown fields dropped)."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"ProfileResult 'conditions' must be a dict, got {type(data).__name__}")
    out = {}
    for name, kind in FIELDS.items():
        value = data.get(name)
        if value is None:
            if name in ("wall_s", "cpus"):
                raise ValueError(f"ProfileResult conditions need {name!r}")
            out[name] = None
            continue
        if kind is float:
            if not _is_number(value) or value < 0:
                raise ValueError(f"ProfileResult conditions {name!r} must be a finite number "
                                 f">= 0, got {value!r:.60}")
            value = float(value)
        elif kind is int:
            if type(value) is not int or not 0 <= value <= MAX_COUNT:
                raise ValueError(f"ProfileResult conditions {name!r} must be an integer in "
                                 f"[0, {MAX_COUNT}]")
        elif name == "cpus":
            if (not isinstance(value, list) or not 0 < len(value) <= MAX_CPUS
                    or not all(type(c) is int and 0 <= c < MAX_CPU_NUMBER for c in value)):
                raise ValueError("ProfileResult conditions 'cpus' must be a non-empty list of "
                                 f"at most {MAX_CPUS} CPU numbers")
        elif name == "freq_mhz":
            if (not isinstance(value, list) or len(value) != 2
                    or not all(_is_number(f) and f >= 0 for f in value)):
                raise ValueError("ProfileResult conditions 'freq_mhz' must be [lowest, highest]")
            value = [float(f) for f in value]
        elif name == "threads":
            value = _check_threads(value)
        out[name] = value
    return out


def _check_threads(value) -> list[dict]:
    if not isinstance(value, list) or len(value) > MAX_THREADS:
        raise ValueError(f"ProfileResult conditions 'threads' must be a list of at most "
                         f"{MAX_THREADS} threads")
    threads = []
    for item in value:
        if not isinstance(item, dict):
            raise ValueError("ProfileResult conditions 'threads' entries must be dicts")
        tid, cpu, seconds = item.get("tid"), item.get("cpu"), item.get("cpu_s")
        if (type(tid) is not int or not 0 <= tid <= MAX_TID
                or not (cpu is None or type(cpu) is int and 0 <= cpu < MAX_CPU_NUMBER)
                or not _is_number(seconds) or seconds < 0):
            raise ValueError("ProfileResult conditions 'threads' entries need a thread number "
                             f"'tid' (up to {MAX_TID}), a CPU number 'cpu' (or null) and a "
                             "number 'cpu_s' >= 0")
        threads.append({"tid": tid, "cpu": cpu, "cpu_s": float(seconds)})
    return threads


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))
