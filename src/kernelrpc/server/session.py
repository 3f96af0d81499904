"""Running one session in a child process, and reporting how it ended.

The parent forks a child per session. The child owns the connection from the
version exchange on; the parent keeps its copy of the socket only to tell the
client how the session ended when the child cannot (it crashed, or it ran past
the session timeout and was killed), and it removes the session's workspace.

A session's whole process tree ends with it (``process_tree``): whatever a kernel
starts stays below the session child, its subreaper, even outside the session's
process group (``setsid``), and the child kills it before it exits. The server is
the subreaper of its session children, so what a child killed outright leaves is
adopted by the server, which kills it. When the server dies (even of kill -9), the
child's parent-death signal (a real-time signal, taken by a thread that waits for
nothing else) kills the tree, then the child.
"""
from __future__ import annotations

import gc
import logging
import os
import select
import signal
import socket
import _thread
import struct
import time

from ..errors import ConnectionLost, ProtocolError, VersionMismatch
from ..netutil import receive_until
from ..wire import protocol as P
from ..wire.hello import HelloParser, check_client_version, encode_hello_accept, encode_hello_refuse
from ..wire.handshake import ParsedKey
from ..wire.transport import FramedSocket
from . import process_tree, registry
from .config import ServerConfig
from .handler import SessionHandler, SessionIdle, TransferTooSlow, session_connection, socket_timed_out
from .workspace import Workspace

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INTERNAL = 70     # unexpected exception in the child; reported to the client as a crash
_CLEAN_END = b"e"      # written by the child to the status pipe when it ends the session itself
_live: set[int] = set()                  # this server's session children not reaped yet
_server_subreaper = False
_TREE_SIGNAL = signal.SIGRTMIN + 1 if hasattr(signal, "SIGRTMIN") and hasattr(signal, "sigwait") else None
"""The session child's parent-death signal: nothing else sends it."""
_STOP_SIGNAL = _TREE_SIGNAL + 1 if _TREE_SIGNAL is not None else None
"""What a session child sends the thread that waits for :data:`_TREE_SIGNAL` to end it."""
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 24
WATCH_STOP_WAIT = 1.0
"""Seconds a session child waits for that thread to end before it exits anyway."""


def pidfd_of(pid: int) -> int | None:
    """A descriptor that becomes readable when process ``pid`` exits; None where there is none
    (Linux before 5.3, or no such process)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def own_child(pid: int) -> None:
    """Count ``pid`` among the server's live children: the orphan sweep after a session leaves
    it alone (session children, and the TLS relays of live sessions)."""
    _live.add(pid)


def child_ended(pid: int) -> None:
    _live.discard(pid)


def kill_group(pid: int) -> None:
    """End a session child and every process it started (a kernel may fork): its process
    group, or the child alone when it has none of its own yet."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def kill_and_reap(pid: int, *, group: bool = True) -> None:
    """SIGKILL a child of this process (with ``group``, its process group: :func:`kill_group`)
    and reap it; a child already gone or reaped is no error."""
    if group:
        kill_group(pid)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class SessionProcess:
    """A session child seen from the parent: wait for it, time it out, clean up after it."""

    def __init__(self, pid: int, sock: socket.socket, workspace: Workspace, timeout: float | None,
                 peer: str, status_fd: int) -> None:
        self.pid = pid
        self._status_fd = status_fd
        self.sock = sock
        self.workspace = workspace
        self.timeout = timeout
        self.peer = peer
        self.started = time.monotonic()
        self.deadline = self.started + timeout if timeout else None
        self.done = False
        self._pidfd = pidfd_of(pid)

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when the child exits (None: poll instead)."""
        return self._pidfd

    def status_fileno(self) -> int:
        """A descriptor that becomes readable when the child says it has ended the session, or
        dies: before it has exited and been reaped (its exit takes a millisecond or more)."""
        return self._status_fd

    def poll(self) -> bool:
        """Reap the child if it has exited; True once the session is over."""
        if self.done:
            return True
        if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return False
        kill_group(self.pid)              # before reaping: until then the group's id cannot be reused
        _, status = os.waitpid(self.pid, 0)
        self._finish(status, self._ended_cleanly())
        return True

    def expire_if_due(self, now: float) -> bool:
        if self.done or self.deadline is None or now < self.deadline:
            return False
        kill_group(self.pid)
        _, status = os.waitpid(self.pid, 0)
        if self._ended_cleanly():  # it ended on its own just in time
            self._finish(status, True)
            return True
        log.info("session from %s expired after %.1fs; child %d killed", self.peer, self.timeout, self.pid)
        self._notify(P.encode_notice(
            P.NOTICE_TIMEOUT, f"your {self.timeout:g}s session has expired; the server ended it. "
            "Increase session_timeout (connect(..., session_timeout=S)) or the server's --session-timeout"))
        self._cleanup()
        return True

    def wait(self, ending=None) -> None:
        """Block until the session is over (used when serving one connection at a time);
        ``ending()`` is called once, when the child says the session is over (``status_fileno``)."""
        while not self.poll():
            timeout = 0.5
            if self.deadline is not None:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    self.expire_if_due(time.monotonic())
                    return
                timeout = min(remaining, timeout)
            if _wait_readable(self._pidfd, timeout, self._status_fd if ending else None):
                ending()
                ending = None

    def kill(self) -> None:
        """End the session now because the server shuts down."""
        if self.done:
            return
        kill_group(self.pid)
        os.waitpid(self.pid, 0)
        self._notify(P.encode_notice(P.NOTICE_SHUTDOWN, "the server is shutting down"))
        self._cleanup()

    def _ended_cleanly(self) -> bool:
        """Whether the child said it ended the session itself (an exit code alone cannot tell:
        a kernel may call ``_exit(0)``)."""
        try:
            return os.read(self._status_fd, 1) == _CLEAN_END
        except OSError:
            return False

    def _finish(self, status: int, clean: bool) -> None:
        if clean:
            self._cleanup()
            log.info("session from %s finished after %.2fs", self.peer, time.monotonic() - self.started)
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
            log.warning("session child %d for %s died of signal %s", self.pid, self.peer, name)
            self._notify(P.encode_notice(
                P.NOTICE_CRASHED, f"the session process died of signal {sig} ({name}), probably in native "
                "code (a kernel); the server goes on serving", signal=sig))
            self._cleanup()
        else:
            code = os.WEXITSTATUS(status)
            log.warning("session child %d for %s exited with code %d", self.pid, self.peer, code)
            self._notify(P.encode_notice(
                P.NOTICE_CRASHED, f"the session process exited with code {code} in the middle of "
                "the session; the server goes on serving", exit_code=code))
            self._cleanup()

    def _notify(self, notice: bytes) -> None:
        """Best effort: tell the client, without ever blocking the server on a stuck peer."""
        try:
            self.sock.setblocking(False)
            self.sock.send(notice)
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _cleanup(self) -> None:
        self.done = True
        child_ended(self.pid)
        if _server_subreaper:
            process_tree.end_orphans(_live)
        self.sock.close()
        os.close(self._status_fd)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.workspace.remove()


def _wait_readable(pidfd: int | None, timeout: float, status_fd: int | None = None) -> bool:
    """Wait for the child's exit (or ``timeout``); True if ``status_fd`` became readable."""
    watched = [fd for fd in (pidfd, status_fd) if fd is not None]
    if pidfd is None:  # no pidfd on this system: poll
        timeout = min(timeout, 0.05)
    readable, _, _ = select.select(watched, [], [], timeout)
    return status_fd is not None and status_fd in readable


def start_session(sock: socket.socket, client_key: ParsedKey, config: ServerConfig,
                  initial: bytes = b"", peer: str | None = None) -> SessionProcess:
    """Fork the session's child; returns at once with the parent's view of it. ``sock`` may
    also be the plain end of a TLS relay (``tls_relay``), which names the ``peer``."""
    workspace = new_workspace(config)
    timeout = config.effective_timeout(client_key.timeout)
    status_r, status_w = os.pipe()

    def serve() -> bool:
        os.chdir(workspace.root)
        run_session(sock, workspace, config, timeout, initial)
        return True

    pid = fork_child(config, (sock.fileno(), status_w), status_w, serve)
    os.close(status_w)
    os.set_blocking(status_r, False)
    return SessionProcess(pid, sock, workspace, timeout, peer_of(sock, peer), status_r)


def new_workspace(config: ServerConfig) -> Workspace:
    """A session's workspace, owned by the user its child runs as."""
    workspace = Workspace.create(config.workspace_root)
    if config.session_user is not None:
        os.chown(workspace.root, config.session_user.uid, config.session_user.gid)
    return workspace


def peer_of(sock: socket.socket, peer: str | None = None) -> str:
    if peer:
        return peer
    try:
        return "%s:%s" % sock.getpeername()[:2]
    except OSError:
        return "?"


def become_subreaper() -> bool:
    """Make the server the subreaper of its session children (once); whether it is."""
    global _server_subreaper
    if not _server_subreaper:
        _server_subreaper = process_tree.set_child_subreaper()
    return _server_subreaper


def fork_child(config: ServerConfig, keep_fds, status_fd: int, body) -> int:
    """Fork a session child that keeps only ``keep_fds`` open and runs ``body()``; returns its pid.

    ``body`` returns True when it served a session to its end (the child then writes
    :data:`_CLEAN_END` to ``status_fd``). Used for a session's child and for a spare (``spare``).
    """
    become_subreaper()
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        child_main(config, keep_fds, status_fd, body, server_pid)
    own_child(pid)
    try:
        os.setpgid(pid, pid)            # also done by the child: whichever runs first
    except OSError:
        pass
    return pid


def serve_connection(sock: socket.socket, client_key: ParsedKey, config: ServerConfig,
                     initial: bytes = b"") -> None:
    """Serve one handshaken connection to its end (session child, timeout, crash report)."""
    start_session(sock, client_key, config, initial).wait()


def _end_with_the_server(server_pid: int) -> "_ServerWatch | None":
    """The session's own process group, the subreaper of its tree, and the whole tree killed
    when the server dies (even of kill -9); returns the thread that waits for that
    (:class:`_ServerWatch`), None where there is none."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    process_tree.set_child_subreaper()
    if _TREE_SIGNAL is None:            # not Linux: the server's kill of the group must do
        return None
    signal.pthread_sigmask(signal.SIG_BLOCK, {_TREE_SIGNAL, _STOP_SIGNAL})    # threads started later inherit it
    watch = _ServerWatch()
    process_tree.set_parent_death_signal(_TREE_SIGNAL)
    if os.getppid() != server_pid:      # the server died before the signal was armed
        os.kill(os.getpid(), _TREE_SIGNAL)
    return watch


class _ServerWatch:
    """The thread that ends the session's tree, then the child, when the server dies.

    The parent-death signal is a real-time signal blocked in every thread and taken by this one,
    which waits for it: it comes through even while a kernel runs native code (ctypes lets go
    of the GIL), and processes a kernel starts inherit only a blocked signal nobody sends.

    The child ends the thread (:meth:`stop`) before it exits: a thread still exiting in the
    kernel when the process exits makes the server's reap of the child wait for it, on a busy
    CPU up to a scheduler tick (docs/performance.md, "A session child's exit with one thread").
    """

    def __init__(self) -> None:
        self._started = _thread.allocate_lock()
        self._started.acquire()
        self._ident = self._tid = 0
        _thread.start_new_thread(self._wait, ())    # threading's start() would wait for it to run

    def _wait(self) -> None:
        self._ident, self._tid = _thread.get_ident(), _thread.get_native_id()
        self._started.release()
        if signal.sigwait({_TREE_SIGNAL, _STOP_SIGNAL}) == _TREE_SIGNAL:
            process_tree.end_tree()
            os._exit(EXIT_INTERNAL)

    def stop(self) -> bool:
        """End the thread and wait until it is gone from the kernel too; False (logged) if it
        did not go within :data:`WATCH_STOP_WAIT`. A parent-death signal that comes meanwhile
        stays pending: the child ends its tree on its way out anyway."""
        if not self._started.acquire(timeout=WATCH_STOP_WAIT):
            log.warning("session child %d: its server watch did not start", os.getpid())
            return False
        signal.pthread_kill(self._ident, _STOP_SIGNAL)
        if process_tree.thread_gone(self._tid, WATCH_STOP_WAIT):
            return True
        log.warning("session child %d: its server watch had not ended %gs after it was told to",
                    os.getpid(), WATCH_STOP_WAIT)
        return False


def child_main(config: ServerConfig, keep_fds, status_fd: int, body, server_pid: int) -> None:
    """A session child's life (a spare's too, forked here or by the ``forker``): never returns."""
    code = EXIT_INTERNAL
    watch = None
    gc.freeze()     # the server's objects: a full collection would touch (and copy) all their pages
    try:
        signal.set_wakeup_fd(-1)        # the server's: not ours to write to
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which ends us
        if config.session_user is not None:
            config.session_user.drop()  # first: a change of user clears the parent-death signal
        watch = _end_with_the_server(server_pid)
        close_all_but(keep_fds)
        if body():
            os.write(status_fd, _CLEAN_END)
        code = EXIT_OK
    except BaseException:
        log.exception("session child failed")
    finally:
        try:
            if watch is not None:
                watch.stop()
            process_tree.end_tree()     # the server may be gone already, its signal not yet taken
        finally:
            os._exit(code)


def close_all_but(keep_fds) -> None:
    """Close every descriptor from 3 up except ``keep_fds``."""
    low = 3
    for fd in sorted(keep_fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def _linger(sock: socket.socket) -> None:
    """After the last frame of a session the server ends: wait up to :data:`LINGER_SECONDS` for
    the client to hang up, dropping what it sends meanwhile (at most :data:`LINGER_BYTES`). A
    socket closed with unread bytes resets the connection, and the client's kernel may then
    drop the error frame before the client reads it (a client that sent its next request
    before the error came)."""
    deadline = time.monotonic() + LINGER_SECONDS
    taken = 0
    try:
        sock.shutdown(socket.SHUT_WR)
        while taken < LINGER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock.settimeout(left)
            data = sock.recv(1 << 16)
            if not data:
                break
            taken += len(data)
    except OSError:
        pass


def _set_socket_timeouts(sock: socket.socket, seconds: float) -> None:
    """Kernel-side receive and send timeouts (SO_RCVTIMEO/SO_SNDTIMEO): a stalled peer makes a
    blocking call fail with EAGAIN, at no cost per call (a Python socket timeout polls first)."""
    if not seconds:
        return
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, value)


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 4096


def session_info(config: ServerConfig, timeout: float | None) -> dict:
    """What the server's hello tells the client: the session's limits and global functions."""
    return {"session_timeout": timeout or 0, "max_frame_bytes": config.max_frame_bytes,
            "max_upload_bytes": config.max_upload_bytes, "max_tensor_bytes": config.max_tensor_bytes,
            "max_session_bytes": config.max_session_bytes, "max_client_tensors": config.max_client_tensors,
            "globals": registry.names(), "server": "kernelrpc", "pid": os.getpid(),
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}


def run_session(sock: socket.socket, workspace: Workspace, config: ServerConfig,
                timeout: float | None, initial: bytes = b"") -> None:
    """The child's whole life: version exchange, then requests, until the session ends."""
    sock.setblocking(True)
    if sock.family != socket.AF_UNIX:   # a TLS relay's socketpair has no Nagle to turn off
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(config.handshake_timeout)
    parser = HelloParser()
    try:
        version = receive_until(sock, parser, "the client", "the version exchange", initial, 4096)
        check_client_version(version)
    except (VersionMismatch, ProtocolError) as exc:
        log.warning("refusing session: %s", exc)
        try:
            sock.sendall(encode_hello_refuse(str(exc)))
        except OSError:
            pass
        return
    except (OSError, ConnectionLost) as exc:  # includes the hello deadline
        log.warning("session hello failed: %s", exc)
        return
    sock.settimeout(None)
    _set_socket_timeouts(sock, config.socket_timeout())
    conn = FramedSocket(sock, initial=parser.unused, reader=session_connection(config))
    try:
        conn.send(encode_hello_accept(session_info(config, timeout)))
        SessionHandler(conn, workspace, config).serve()
    except (SessionIdle, TransferTooSlow) as exc:
        log.warning("session ended: %s", exc)
        try:
            conn.send(P.encode_notice(P.NOTICE_TIMEOUT, str(exc)))
        except ConnectionLost:
            pass
    except ConnectionLost as exc:
        if socket_timed_out(exc):
            log.warning("session ended: a frame or transfer stalled for %g s (--io-timeout)", config.io_timeout)
        else:
            log.info("client disconnected")
    except ProtocolError as exc:
        log.warning("protocol error, ending session: %s", exc)
        try:
            conn.send(P.encode_error("ProtocolError", str(exc)))
        except ConnectionLost:
            return
        _linger(sock)
