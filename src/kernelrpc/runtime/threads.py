"""Thread counts for the modules' thread pools.

Every exported module carries its own pool (docs/module-format.md), sized per module by
``Module.set_num_threads(n)``. This module holds what is shared by the local and the remote
API: the validation of a thread count, and the process-wide setting behind TVM's
``runtime.config_threadpool(affinity_mode, nthreads)``, which applies to every module loaded
in the process and to every module loaded after it. On a device server each session runs in
a child process of its own, so there the process-wide setting is the session's setting.

Affinity: TVM's modes 1 (big cores) and -1 (little cores) are accepted for compatibility but
do not pin threads; kernelrpc's pools run wherever the OS schedules them inside the
process's affinity mask (set it with ``taskset`` or cpusets). Modes -2 and -3 (explicit CPU
lists) are refused.
"""
from __future__ import annotations

import logging
import operator
import os
import re
import threading
import weakref

log = logging.getLogger(__name__)

#: The most threads a caller may ask for. Generated modules cap their pool lower (64 today)
#: and report the number they really use; this bound only rejects numbers that cannot be
#: meant (a count arriving over the network is untrusted).
MAX_NUM_THREADS = 1024

AFFINITY_BIG = 1
AFFINITY_DEFAULT = 0
AFFINITY_LITTLE = -1
_AFFINITY_NAMES = {AFFINITY_BIG: "big", AFFINITY_DEFAULT: "default", AFFINITY_LITTLE: "little"}
_CPU_LIST_MODES = (-2, -3)  # TVM's kSpecifyOneCorePerThread, kSpecifyThreadShareAllCore

_ENV_VARS = ("KERNELRPC_NUM_THREADS", "TVM_NUM_THREADS")
_LEADING_INT = re.compile(r"\s*([+-]?\d+)")


def _as_int(value, where: str, what: str) -> int:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise TypeError(f"{where}: {what} must be an integer, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {what} must be an integer, got {type(value).__name__}") from None


def check_num_threads(n, where: str = "set_num_threads()") -> int:
    """``n`` as an int in [0, MAX_NUM_THREADS] (0 = all usable cores); TypeError/ValueError."""
    number = _as_int(n, where, "the number of threads")
    if not 0 <= number <= MAX_NUM_THREADS:
        raise ValueError(f"{where}: {number} threads is out of range [0, {MAX_NUM_THREADS}] "
                         "(0 = all usable cores)")
    return number


def check_affinity_mode(mode, where: str = "config_threadpool()") -> int:
    """TVM's affinity mode as an int: 1 (big), 0 (default) or -1 (little)."""
    number = _as_int(mode, where, "affinity_mode")
    if number in _CPU_LIST_MODES:
        raise ValueError(f"{where}: affinity_mode {number} (an explicit CPU list) is not "
                         "supported; use 0 and restrict the server's CPUs with taskset")
    if number not in _AFFINITY_NAMES:
        raise ValueError(f"{where}: affinity_mode must be 1 (big), 0 (default) or -1 (little), "
                         f"got {number}")
    return number


def usable_cores() -> int:
    """Cores in this thread's affinity mask (what a module's pool counts as "all cores")."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_num_threads() -> int:
    """The size a module's pool starts with: ``KERNELRPC_NUM_THREADS``, else
    ``TVM_NUM_THREADS``, else the usable cores; read the way the native pool reads it
    (C ``atoi`` of the first variable that is set; 0 or less means all usable cores)."""
    for var in _ENV_VARS:
        value = os.environ.get(var)
        if value is not None:
            match = _LEADING_INT.match(value)
            number = int(match.group(1)) if match else 0
            break
    else:
        number = 0
    if number <= 0:
        number = usable_cores()
    return min(number, MAX_NUM_THREADS)


class ThreadPoolConfig:
    """A thread count applied to every module it tracks, now and on ``track`` later.

    ``nthreads`` is None until :meth:`configure` sets a count, and again after
    ``configure(mode, 0)``, which puts every pool back to :func:`default_num_threads`.
    """

    def __init__(self) -> None:
        self.nthreads: int | None = None
        self.affinity_mode = AFFINITY_DEFAULT
        self._modules: weakref.WeakSet = weakref.WeakSet()
        self._lock = threading.Lock()

    def track(self, module) -> None:
        """Remember a newly loaded module; give it the configured count if there is one."""
        with self._lock:
            self._modules.add(module)
            nthreads = self.nthreads
        if nthreads is not None:
            module.set_num_threads(nthreads)

    def configure(self, affinity_mode, nthreads) -> None:
        """TVM's ``config_threadpool``: ``nthreads`` for every module's pool (0 = default)."""
        mode = check_affinity_mode(affinity_mode)
        count = check_num_threads(nthreads, "config_threadpool()")
        if mode != AFFINITY_DEFAULT:
            log.info("config_threadpool: affinity_mode %d (%s cores) accepted but threads are "
                     "not pinned; they run anywhere in the process's affinity mask",
                     mode, _AFFINITY_NAMES[mode])
        with self._lock:
            self.affinity_mode = mode
            self.nthreads = count or None
            modules = list(self._modules)
        applied = count or default_num_threads()
        for module in modules:
            module.set_num_threads(applied)
        log.debug("config_threadpool(%d, %d): %d threads for %d loaded modules",
                  mode, count, applied, len(modules))


#: The setting for this process (on a device server: for this session's child process).
process_config = ThreadPoolConfig()


def config_threadpool(affinity_mode, nthreads) -> None:
    """TVM's ``runtime.config_threadpool`` for this process: every module loaded so far and
    every module loaded later uses ``nthreads`` threads (0 = back to the default size).
    ``affinity_mode`` is 1, 0 or -1; see the module docstring for what it does (nothing yet)."""
    process_config.configure(affinity_mode, nthreads)
