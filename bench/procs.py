"""What the benchmarks share for the processes and sockets they drive: start a service and wait
for the line that says where it listens, kill its whole process group, read exactly n bytes."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys


def start(cmd: list[str], pattern: str, env=None, preexec_fn=None) -> tuple[subprocess.Popen, tuple[str, int]]:
    """Start ``cmd`` in a process group of its own; returns it and the (host, port) that the first
    output line matching ``pattern`` (two groups) names."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=preexec_fn)
    for line in proc.stdout:
        m = re.search(pattern, line)
        if m:
            return proc, (m.group(1), int(m.group(2)))
    raise RuntimeError(f"{cmd} did not start")


def stop(proc: subprocess.Popen) -> None:
    """Kill the whole process group: TVM's rpc_server serves from a worker child of its own."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def recv_exactly(sock, n: int, buf) -> None:
    """Fill the first ``n`` bytes of ``buf`` (any writable buffer) from ``sock``."""
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if not k:
            raise ConnectionError("peer closed")
        got += k


@contextlib.contextmanager
def deadline(seconds: float, what: str):
    """Raise TimeoutError naming ``what`` if the block runs longer than ``seconds``; SIGALRM also
    interrupts Apache TVM's blocking C++ socket calls, which take no timeout of their own."""
    def expired(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)
