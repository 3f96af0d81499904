"""A session's whole process tree ends with the session (Linux; standard library only).

A kernel may fork, and a forked process may leave the session's process group (``setsid``),
so killing the group is not enough. Two Linux facilities close the gap:

* ``PR_SET_CHILD_SUBREAPER``: a process whose parent dies is adopted by its nearest
  subreaper ancestor instead of init, so a session's orphans stay inside the session's
  tree, where they can be found (``descendants``) and killed;
* ``PR_SET_PDEATHSIG``: a signal to a process when its parent dies, even of kill -9.

Elsewhere (or when ``prctl`` fails) the calls say so once in the log and return False;
the session's process group is then all that is killed.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_libc = None
_warned: set[str] = set()
_unreaped: set[int] = set()      # adopted orphans killed and not reaped yet (the server's)
_HAS_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _prctl(option: int, value: int, what: str) -> bool:
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        if _libc.prctl(option, value, 0, 0, 0) == 0:
            return True
        problem = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:   # not Linux
        problem = str(exc) or type(exc).__name__
    if what not in _warned:
        _warned.add(what)
        log.warning("%s is not available (%s): processes a kernel starts outside the session's "
                    "process group may outlive the session", what, problem)
    return False


def set_child_subreaper() -> bool:
    """Make the calling process adopt its descendants' orphans."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1, "prctl(PR_SET_CHILD_SUBREAPER)")


def set_parent_death_signal(sig: int) -> bool:
    """Have ``sig`` sent to the calling process when its parent (the forking thread) ends.
    A change of user clears it: call it after dropping privileges."""
    return _prctl(_PR_SET_PDEATHSIG, sig, "prctl(PR_SET_PDEATHSIG)")


def children(pid: int) -> list[int]:
    """The live (or not yet reaped) children of ``pid``."""
    if not _HAS_CHILDREN_FILES:
        return _children_by_scan(pid)
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += map(int, f.read().split())
        except OSError:                    # a thread that ended meanwhile
            continue
    return out


def _children_by_scan(pid: int) -> list[int]:
    """``children`` for kernels without ``/proc/PID/task/TID/children`` (CONFIG_PROC_CHILDREN)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children(p)]
        out += below
        frontier = below
    return out


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(pids: set[int]) -> None:
    for pid in list(pids):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:          # not ours (any more), or already reaped
            done = pid
        if done:
            pids.discard(pid)


def end_tree(deadline: float = 2.0) -> bool:
    """Kill every descendant of this process and reap them (a session child whose server died).

    Processes forked while the tree is being killed are adopted by this process (it is their
    subreaper) and caught in the next round. True when none is left within ``deadline`` s.
    """
    end = time.monotonic() + deadline
    while True:
        below = descendants(os.getpid())
        if not below:
            return True
        _kill(below)
        _reap(set(children(os.getpid())))
        if time.monotonic() > end:
            log.warning("processes %s of the session did not end within %g s", below[:10], deadline)
            return False
        time.sleep(0.001)


def thread_gone(tid: int, timeout: float) -> bool:
    """Wait (sleeping) until thread ``tid`` of this process is gone from ``/proc`` (Linux):
    True once it is, False after ``timeout`` seconds.

    A thread whose Python code is done (``join`` returned, or its function returned) still has
    to exit in the kernel, and until it has, this process is not done with it: the process is
    reported exited only once every thread of it has ended, and a thread that is still exiting
    when the process exits makes the parent's reap of it wait for that thread (on a busy CPU,
    up to a scheduler tick: docs/performance.md, "A session child's exit with one thread")."""
    path = f"/proc/self/task/{tid}"
    deadline = time.monotonic() + timeout
    pause = 0.0001
    while os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)       # the CPU is the thread's meanwhile, if nothing else wants it,
        pause = min(pause * 2, 0.01)    # and a busy CPU is not woken up for this more than 100 times a second
    return True


def end_orphans(keep) -> list[int]:
    """Kill the trees of this process's children that are not in ``keep`` (the live sessions),
    and reap them; returns their pids.

    A server is the subreaper of its session children: when one ends (or is killed), what its
    session started and left running is adopted by the server. Its other children (session
    children, TLS relays, its forker and the spares it forked) are in ``keep`` from the moment
    the server knows them, so every other child is an orphan of a session that ended.
    Children that are not dead within 0.1 s are reaped on a later call.
    """
    me = os.getpid()
    orphans = [pid for pid in children(me) if pid not in keep and pid not in _unreaped]
    if orphans:
        _kill([pid for orphan in orphans for pid in descendants(orphan)] + orphans)
        log.info("killed %d process(es) left behind by ended sessions: %s", len(orphans), orphans[:10])
        _unreaped.update(orphans)
    end = time.monotonic() + 0.1
    while _unreaped:
        _reap(_unreaped)
        if not _unreaped or time.monotonic() > end:
            break
        time.sleep(0.001)
    return orphans


def process_name(pid: int | str = "self") -> bytes | None:
    """The name (``comm``) of process ``pid``, this one by default; None where there is none."""
    try:
        with open(f"/proc/{pid}/comm", "rb", buffering=0) as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return None


def set_process_name(name: bytes) -> None:
    try:
        with open("/proc/self/comm", "wb", buffering=0) as f:
            f.write(name)
    except OSError:
        pass
