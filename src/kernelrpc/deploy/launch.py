"""Start kernelrpc services as users do (``python -m ...``) and wait for their ready line.

Every service prints one line ``<name> listening on <host>:<port>`` to stdout once it
has bound its socket; callers wait for that line instead of sleeping. Used by the
demo and by the tests.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"listening on (\S+):(\d+)")
SRC = str(Path(__file__).resolve().parents[2])
"""The directory holding the ``kernelrpc`` package, put on the children's PYTHONPATH."""


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _is_listening(pid: int, port: int) -> bool:
    """True when a socket in process ``pid``'s network namespace listens on ``port``.

    Always True where /proc is absent (not Linux).
    """
    found_table = False
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        found_table = True
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return not found_table


class Service:
    """A running ``python -m`` service; its output is collected in ``lines``."""

    def __init__(self, module: str, args: list[str], *, env: dict | None = None,
                 ready: re.Pattern = READY, timeout: float = 30.0, python: str | None = None,
                 preexec_fn=None):
        self.module = module
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._pattern = ready
        self.match: re.Match | None = None
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=child_env(env), start_new_session=True,
            preexec_fn=preexec_fn)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        end = time.monotonic() + timeout
        if not self._ready.wait(timeout) or self.match is None or not self._await_listen(end):
            self.stop()
            raise RuntimeError(f"{module} did not become ready in {timeout}s; output:\n" + "\n".join(self.lines))

    def _await_listen(self, deadline: float) -> bool:
        """Wait until the announced port is really listening.

        Apache TVM's services print their "bind to" line between ``bind()`` and ``listen()``,
        so a client that connects on that line can be refused; ours print after ``listen()``.
        """
        try:
            port = int(self.match.group(2))
        except (IndexError, ValueError):
            return True
        while not _is_listening(self.proc.pid, port):
            if time.monotonic() > deadline or not self._reader.is_alive():
                return _is_listening(self.proc.pid, port)
            self._reader.join(0.01)
        return True

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if self.match is None:
                m = self._pattern.search(line)
                if m:
                    self.match = m
                    self._ready.set()
        self._ready.set()

    @property
    def host(self) -> str:
        return self.match.group(1)

    @property
    def port(self) -> int:
        return int(self.match.group(2))

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def wait_for_line(self, pattern: str, timeout: float = 30.0) -> str:
        """Wait until a line matching ``pattern`` has been printed; return it."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                if regex.search(line):
                    return line
            if not self._reader.is_alive():
                break
            self._reader.join(0.05)
        raise TimeoutError(f"{self.module}: no line matching {pattern!r}; output:\n" + "\n".join(self.lines))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._reader.join(2)
        return self.proc.returncode
