"""The process the spares are forked from, so that the server itself forks once, at its start.

After a fork, the forking process and its child share every page, write-protected, and the
first write of each page traps and copies it. Python writes an object's reference count each
time it uses the object, so a server that forked each spare itself paid for it on the next
connection's path: measured, 110 faults of about 4 us on the way from ``accept`` to the
handshake's reply, and some 500 in each session cycle (docs/performance.md, "The server forks
once"). The forker is forked from the server once, after the server's own warm-up
(``spare.warm_up_server``), so that it holds the same quickened code; it then forks each
spare on request, and the server's pages stay its own.

A request is one message on a unix socketpair: the spare's descriptors (``SCM_RIGHTS``) and
a payload the server's ``body_for`` reads; the answer is the spare's pid. The forker has
forked the child ahead, through a middle process, and hands it the request; the server kills
the middle process when the answer comes: the spare is then
adopted by the server (its subreaper, ``process_tree``), whose child it is like any session
child, reaped and watched by the server, its parent-death signal armed against the server.
The forker dies with the server (its own parent-death signal) and ends when the server
closes the socket.

The server does not wait for an answer: it goes on serving, and the spare is its own once the
answer comes (the selector watches for it). A forker that has gone (it died, or was killed) is
logged once, and the server forks its spares itself again. Standard library only, like the
rest of the device server.
"""
from __future__ import annotations

import errno
import gc
import logging
import os
import select
import signal
import socket
import struct
import time
from collections.abc import Callable

from . import process_tree
from .session import EXIT_INTERNAL, become_subreaper, child_main, close_all_but, own_child, pidfd_of

log = logging.getLogger(__name__)

ADOPTION_WAIT = 5.0
"""Seconds a new spare waits for the server to adopt it (its middle parent to exit)."""
MAX_PAYLOAD = 4096
NAME = b"kernelrpc-fork"
_PID = struct.Struct("!i")
_ANSWER = struct.Struct("!ii")   # the middle process, the child (or minus an errno)


def is_forker(pid: int) -> bool:
    """Whether process ``pid`` is a server's forker (Linux)."""
    return process_tree.process_name(pid) == NAME


class ForkerGone(Exception):
    """The forker did not answer: the server forks for itself."""


class Forker:
    """The server's end of its forker. ``body_for(fds, payload)`` runs in the forker, in each new
    child, and returns what the child runs (``session.child_main``'s ``body``)."""

    def __init__(self, config, body_for: Callable[[list[int], bytes], Callable[[], bool]]) -> None:
        if not become_subreaper():
            raise OSError("this system has no child subreaper: the forker's children would not be the server's")
        self.config = config
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _forker_main(theirs, config, body_for, server_pid)
        theirs.close()
        own_child(pid)          # not an orphan of a session: the server's sweep leaves it alone
        self.pid = pid
        self._sock = ours

    def fileno(self) -> int:
        """Readable when an answer is there (:meth:`answer`)."""
        return self._sock.fileno()

    def request(self, fds: list[int], payload: bytes) -> None:
        """Ask for a new child of the server that keeps ``fds`` (the last one its status pipe)
        and runs ``body_for(fds, payload)``; its pid comes as the next :meth:`answer`."""
        try:
            socket.send_fds(self._sock, [payload], fds)
        except OSError as exc:
            raise ForkerGone(f"the forker ({self.pid}) has gone: {exc}") from None

    def answer(self) -> int | None:
        """The pid of the child asked for first, or None when the forker has not answered yet;
        OSError if it could not fork, ForkerGone if it has gone. The child is the server's a
        moment later, when its middle process has exited (it waits for that before it runs)."""
        try:
            answer = self._sock.recv(_ANSWER.size, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            raise ForkerGone(f"the forker ({self.pid}) has gone: {exc}") from None
        if len(answer) != _ANSWER.size:
            raise ForkerGone(f"the forker ({self.pid}) has gone")
        middle, pid = _ANSWER.unpack(answer)
        if pid < 0:
            raise OSError(-pid, f"the forker could not fork: {os.strerror(-pid)}")
        own_child(pid)
        try:
            os.kill(middle, signal.SIGKILL)     # the child is the server's once the middle is gone
        except ProcessLookupError:
            pass
        return pid

    def close(self) -> None:
        """End the forker (it exits when its socket closes) and reap it."""
        self._sock.close()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0] == self.pid:
                    return
            except ChildProcessError:
                return
            time.sleep(0.005)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _forker_main(sock: socket.socket, config, body_for, server_pid: int) -> None:
    try:
        gc.freeze()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # the middle processes, reaped by the kernel
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the server's, which closes our socket
        process_tree.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(0)
        close_all_but([sock.fileno()])
        server_name = process_tree.process_name()
        process_tree.set_process_name(NAME)
        ready = None
        while True:
            if ready is None:
                ready = _fork_ahead(config, body_for, server_pid, server_name)
            try:
                payload, fds, _, _ = socket.recv_fds(sock, MAX_PAYLOAD, 8)
            except OSError:
                break
            if not payload and not fds:
                break
            try:
                answer = _ANSWER.pack(*_hand(ready, fds, payload))
            except OSError as exc:
                answer = _ANSWER.pack(0, -(exc.errno or errno.EIO))
            finally:
                ready = None
                for fd in fds:
                    os.close(fd)
            try:
                sock.sendall(answer)
            except OSError:
                break
    finally:
        os._exit(0)


class _Ahead:
    """A child forked ahead through its middle process, waiting on ``link`` for its request."""

    def __init__(self, middle: int, child: int, link: socket.socket) -> None:
        self.middle, self.child, self.link = middle, child, link


def _fork_ahead(config, body_for, server_pid: int, name: bytes | None) -> _Ahead | OSError:
    """Fork the next child ahead of its request, through a middle process that waits to be
    killed: the server kills it once it knows the child's pid, and adopts the child then, never
    before, so that its sweep of orphans (``process_tree.end_orphans``) cannot take the child
    for one. A request then costs no fork on its way (two, the middle's and the child's)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_end, write_end = os.pipe()
    try:
        middle = os.fork()
        if middle == 0:
            try:
                os.close(read_end)
                ours.close()
                process_tree.set_parent_death_signal(signal.SIGKILL)   # with the forker
                pid = os.fork()
                if pid == 0:
                    os.close(write_end)
                    _child_of_request(theirs, config, body_for, server_pid, name)
                os.write(write_end, _PID.pack(pid))
                while True:
                    signal.pause()
            finally:
                os._exit(0)
        os.close(write_end)
        write_end = -1
        answer = os.read(read_end, _PID.size)
    except OSError as exc:
        ours.close()
        return exc
    finally:
        theirs.close()
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    if len(answer) != _PID.size:
        ours.close()
        return OSError(errno.ECHILD, "the middle process could not fork")
    return _Ahead(middle, _PID.unpack(answer)[0], ours)


def _hand(ahead: _Ahead | OSError, fds: list[int], payload: bytes) -> tuple[int, int]:
    """Give the child forked ahead its request: ``(middle, child)``."""
    if isinstance(ahead, OSError):
        raise ahead
    with ahead.link:
        socket.send_fds(ahead.link, [payload], fds)
    return ahead.middle, ahead.child


def _child_of_request(link: socket.socket, config, body_for, server_pid: int, name: bytes | None) -> None:
    try:
        payload, fds, _, _ = socket.recv_fds(link, MAX_PAYLOAD, 8)
    except OSError:
        os._exit(0)
    if not fds:             # the forker ended before it had a request for us
        os._exit(0)
    link.close()
    if name is not None:
        process_tree.set_process_name(name)     # a session child named as the server's own
    _await_adoption(server_pid)
    child_main(config, fds, fds[-1], body_for(fds, payload), server_pid)


def _await_adoption(server_pid: int) -> None:
    """Wait until the server has adopted this process: its middle parent's exit (a kernel
    reparents the children of a process before its exit shows on a pidfd); polled where there
    is no pidfd."""
    middle = os.getppid()
    pidfd = pidfd_of(middle) if middle != server_pid else None
    if pidfd is not None:
        try:
            if os.getppid() == middle:      # (not a reused pid)
                select.select([pidfd], [], [], ADOPTION_WAIT)
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + ADOPTION_WAIT
    while os.getppid() != server_pid:
        if time.monotonic() > deadline:
            os._exit(EXIT_INTERNAL)
        time.sleep(0.0001)
