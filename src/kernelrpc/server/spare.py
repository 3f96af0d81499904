"""A spare session child: forked and warmed before the client arrives, handed the next session.

A session child is a fork of the server, so its first touches of the server's memory are
copy-on-write page faults: a fresh child's first ``get_function`` + call took about a hundred
of them, more than twice the time of the second. A spare takes those faults while no client
waits. Right after its fork it serves a short scripted session (:func:`_warm_up_script`: the version
exchange, a global function looked up, called and freed, a small tensor allocated, filled,
read back and freed) through the real :func:`~.session.run_session` on a socketpair, and
a time_evaluator's run without a kernel (:func:`~kernelrpc.runtime.evaluator.warm_up`: the
timing loop, the device-conditions probe's real measurement, the packed result), and it takes
a reference to the code a first module call runs (:func:`_touch_code`), then tells the server
it is warm and waits for it to hand it a connection. The server has served the same script
itself, before its first fork (:func:`warm_up_server`), often enough that the interpreter has
quickened that code: every child inherits it so, and a spare's warm-up is there for its
copy-on-write faults.

The server asks for the next spare as soon as the session before it is over, while its child
still exits (:mod:`.listener`); its forker (:mod:`.forker`) forks it, so that the server's own
pages are never shared with a new child, and the spare is the server's child like any other.
A spare forked while other sessions run (``max_sessions`` above 1) warms up at the lowest CPU
priority (``SCHED_IDLE``: only on CPU time no session wants), in a thread of its own (:func:`_warm_up_in_background`), so that the thread that serves its session
keeps its priority; the spare goes on once that thread has ended in the kernel too
(:func:`~.process_tree.thread_gone`). Only a warm spare is handed a session: a client that arrives
while it warms up waits for it up to :data:`WARM_UP_WAIT`, then gets a child forked for it, and
the spare is kept for the next one.

The handoff is one message on a unix socketpair (:func:`encode_handoff`): the client's socket
as ``SCM_RIGHTS`` ancillary data, and what the session needs that only the client's handshake
decides: its time limit and the bytes the client sent ahead. The session's workspace is the
spare's own, a fresh directory the server created for it at its fork (a spare serves one
session; the warm-up touches no file). From then on the spare is an ordinary session child
(:class:`~.session.SessionProcess`): the server keeps its copy of the socket for the crash,
timeout and shutdown notices, the session's time starts at the handoff, and the child serves
that one session and exits.

Everything else a session child does is done by the spare before it warms up, as for a
session forked at connect (``session.fork_child``): the session user (``--run-as``), its own
process group, the subreaper of its tree, the parent-death signal, every descriptor but its
own closed. A spare that dies before its handoff is reaped and replaced; a session that finds
no spare ready gets a child forked for it, and the log says so.

Standard library only, like the rest of the device server.
"""
from __future__ import annotations

import gc
import logging
import os
import resource
import select
import selectors
import signal
import socket
import struct
import sys
import threading
import time

from ..errors import RemoteError
from ..wire import connection as wire_connection
from ..wire import protocol as P
from ..wire.connection import ClientConnection
from ..wire.hello import HelloReplyParser, encode_hello, encode_hello_accept
from ..wire.handshake import ParsedKey
from ..wire.profile import encode_profile
from ..wire.requests import Array, CopyFrom, CopyTo, Empty, Free, GetGlobal, Shutdown
from ..wire.values import DeviceValue, FunctionHandle, TensorHandle
from ..runtime import buffer, evaluator, module, tensor
from . import handler, process_tree, session as _session
from .config import ServerConfig
from .forker import Forker, ForkerGone
from .session import (SessionProcess, fork_child, kill_and_reap, kill_group, new_workspace, peer_of, pidfd_of,
                      run_session, session_info, start_session)
from .workspace import Workspace

log = logging.getLogger(__name__)

_HANDOFF = struct.Struct("<Id")     # bytes after this field, session timeout (0: none)
MAX_HANDOFF_BYTES = 1 << 20
"""A handoff's largest size (the client's early bytes are at most 64 KiB)."""
REFILL_DELAY = 0.5
"""Seconds before a spare that died unhanded is replaced; doubled for each death in a row."""
MAX_REFILL_DELAY = 60.0
WARM_UP_WAIT = 0.005
"""Seconds a client waits for a spare that is still warming up before a child is forked for it:
about one whole warm-up on an idle CPU. A fork costs the server half a millisecond and the
session's first requests their copy-on-write faults (another half); a spare forked when the
session before ended is usually warm within a few milliseconds of the next client's arrival."""
PROCESS_NAME = b"kernelrpc-spare"
"""What ``ps`` and ``/proc/PID/comm`` show for a warm spare until its handoff (Linux)."""
WARMING_NAME = b"kernelrpc-warm"
"""What they show while it warms up."""
READY = b"r"
"""What a spare sends the server once it is warm: only a warm spare is handed a session."""


def encode_handoff(timeout: float | None, initial: bytes) -> bytes:
    return _HANDOFF.pack(_HANDOFF.size - 4 + len(initial), timeout or 0.0) + initial


def decode_handoff(data: bytes) -> tuple[float | None, bytes]:
    """``(timeout, initial)`` of a whole handoff message; ValueError if it is not one."""
    if len(data) < _HANDOFF.size:
        raise ValueError(f"handoff of {len(data)} bytes is shorter than its header")
    length, timeout = _HANDOFF.unpack_from(data)
    if length + 4 != len(data) or not timeout >= 0:
        raise ValueError("inconsistent handoff header")
    return timeout or None, bytes(data[_HANDOFF.size:])


WARM_UP_LOOKUPS = 2
"""How many times the scripted session looks ``testing.echo`` up and calls it: once with a
GET_GLOBAL, as for a name the hello did not list, then with a GLOBAL_AT sent with the call (each
releasing the one before), as a client's ``get_function`` + call does."""
SERVER_WARM_UPS = 8
"""How many times the server serves the scripted session (and runs the evaluator's warm-up)
itself, once, before its first fork (:func:`warm_up_server`): CPython 3.11 quickens a code object
(the step before it specializes its instructions) on its eighth call, and a fork inherits the
quickened bytecode, so that every session child runs the request path specialized from its first
request on, and a spare's own warm-up only has to take its copy-on-write faults
(docs/performance.md, "A new session's first requests")."""


def _warm_up_script(client: ClientConnection) -> list[tuple[bytes, int]]:
    """What the scripted client sends, one message at a time, through the client's session
    connection (the frees and GLOBAL_ATs it queues go out ahead of the next request, as a
    client's do), and the replies each one gets: the requests of a typical first session, the
    lookup and call ``WARM_UP_LOOKUPS`` times."""
    cpu = DeviceValue("cpu", 0)
    tensor = TensorHandle(2, "float32", (1,), cpu)
    four = b"\0\0\x80?"

    def send(frame: bytes) -> bytes:
        return client.take_queued()[0] + frame    # this server serves RELEASE: nothing ahead answers

    again, last = [], FunctionHandle(1)
    for _ in range(WARM_UP_LOOKUPS - 1):
        client.release(last)
        handle = client.global_at("testing.echo")
        if handle is None:      # a server that takes no pipelined lookup (max_client_tensors 0)
            break
        last = handle
        again.append((send(P.encode_call(last.id, (1,))), 1))
    return [
        (encode_hello(), 0),                                      # answered apart
        (send(P.encode(GetGlobal("testing.echo"))), 1),             # handle 1
        (send(P.encode_call(1, (1,))), 1), (send(P.encode_call(1, (0.5,))), 1),
        (send(P.encode_call(1, ["text", 2])), 1),
        *again,
        (send(P.encode(Free((last,)))), 1),
        (send(P.encode(Empty([1], "float32", cpu))), 1),           # handle 2
        (send(P.encode(CopyTo(tensor, 0, 4))), 0), (four, 1),
        (send(P.encode(CopyFrom(tensor, 0, 4))), 1),
        (send(P.encode(Array([1], "float32", cpu, 4))), 0), (four, 1),    # handle 3
        (send(P.encode(Free((tensor, TensorHandle(3, "float32", (1,), cpu))))), 1),
        (send(P.encode(Shutdown())), 0),
    ]


def _scripted_socketpair() -> tuple[socket.socket, socket.socket]:
    """Message boundaries kept (each request arrives in a read of its own, as from a client that
    waits for each reply), where the system has them."""
    try:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except (OSError, AttributeError):
        return socket.socketpair()


def warm_up(config: ServerConfig, workspace: Workspace) -> int:
    """Serve the scripted session through the real request path, then run and pack a
    time_evaluator without a kernel (no module needed: the server cannot compile one); returns
    the minor page faults it took. Its failures are logged: a spare that could not warm up
    still serves."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    problem = _serve_script(config, workspace)
    _touch_code(_MODULE_CALL_CODE)
    problem = problem or _evaluator_warm_up()
    if problem:
        log.warning("spare session child %d: the warm-up did not go as scripted: %s", os.getpid(), problem)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def warm_up_server(config: ServerConfig) -> None:
    """The server's own warm-up, before its first fork: the scripted session and the evaluator's
    warm-up, :data:`SERVER_WARM_UPS` times, so that the code they run is quickened in the process
    every session child is forked from. Its failures are logged; the server serves anyway."""
    workspace = Workspace.create(config.workspace_root)
    try:
        for _ in range(SERVER_WARM_UPS):
            problem = _serve_script(config, workspace) or _evaluator_warm_up()
            if problem:
                log.warning("the server's warm-up did not go as scripted: %s", problem)
                break
    except Exception:       # noqa: BLE001 (reported, never fatal)
        log.exception("the server's warm-up failed")
    finally:
        workspace.remove()
    gc.collect()            # its garbage, before any child inherits it


def _evaluator_warm_up() -> str | None:
    try:
        P.encode_result(encode_profile(*evaluator.warm_up()))
    except Exception as exc:        # noqa: BLE001 (reported, never fatal)
        return f"the time_evaluator warm-up failed: {type(exc).__name__}: {exc}"
    return None


def _serve_script(config: ServerConfig, workspace: Workspace) -> str | None:
    """Serve the scripted session (:func:`_warm_up_script`); why its replies are not the
    script's, or None."""
    info = HelloReplyParser().feed(encode_hello_accept(session_info(config, None))).info  # as the client hears it
    connection = ClientConnection(info)
    served, client = _scripted_socketpair()
    with served, client:
        script = _warm_up_script(connection)
        for message, _ in script:
            client.sendall(message)
        client.shutdown(socket.SHUT_WR)     # whatever goes wrong, the session ends
        run_session(served, workspace, config, None)     # no request of the script touches files
        served.close()
        client.settimeout(1.0)
        replies = b"".join(iter(lambda: client.recv(1 << 16), b""))
    return _check_replies(replies, connection, sum(n for _, n in script))


_MODULE_CALL_CODE = (module, tensor, buffer, handler, wire_connection)
"""What a session's first module call and time_evaluator run that no warm-up can run without a
compiled module (the connection's kept calls among them)."""


def _touch_code(modules) -> None:
    """Take (and drop) a reference to every function's code object in these modules, so that the
    pages holding them are this process's own before its session first runs them."""
    held = []
    for mod in modules:
        for value in vars(mod).values():
            for item in vars(value).values() if isinstance(value, type) else (value,):
                code = getattr(getattr(item, "fget", item), "__code__", None)
                if code is not None:
                    held.append(code)


def _warm_up_in_background(config: ServerConfig, workspace: Workspace) -> int:
    """``warm_up`` at the lowest CPU priority (:func:`lower_priority`), for a spare forked while
    sessions run: in a thread of its own, so that the thread that serves the session after the
    handoff keeps its priority (an unprivileged process could not raise it again)."""
    faults = []

    def run() -> None:
        priority = lower_priority()
        if priority != "SCHED_IDLE":
            log.info("spare session child %d warms up at %s (SCHED_IDLE refused)", os.getpid(),
                     priority or "its normal priority")
        try:
            faults.append(warm_up(config, workspace))
        except Exception:       # noqa: BLE001 (reported, never fatal: a cold spare still serves)
            log.exception("spare session child %d: the warm-up failed", os.getpid())
        finally:
            if priority == "SCHED_IDLE":
                _normal_policy()    # where allowed: its exit then waits for no idle CPU

    thread = threading.Thread(target=run, name="spare warm-up")
    thread.start()
    thread.join()
    # At SCHED_IDLE on a busy CPU, the thread may not run again for hundreds of milliseconds to
    # exit in the kernel, and the session child this spare becomes could not be reaped until then.
    if not process_tree.thread_gone(thread.native_id, THREAD_EXIT_WAIT):
        log.warning("spare session child %d: its warm-up thread had not ended %gs after its warm-up",
                    os.getpid(), THREAD_EXIT_WAIT)
    return faults[0] if faults else 0


THREAD_EXIT_WAIT = 10.0
"""Seconds a spare waits for its ``SCHED_IDLE`` warm-up thread to be gone from the kernel too."""


def _normal_policy() -> bool:
    """Put the calling thread back to the normal scheduling policy, where it may: a privileged
    process, or one whose ``RLIMIT_NICE`` allows it (an unprivileged one usually cannot leave
    ``SCHED_IDLE``)."""
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False


def lower_priority() -> str | None:
    """Give the calling thread the lowest CPU priority there is: ``SCHED_IDLE`` (it runs only when
    nothing else wants the CPU), else nice 19. Linux only, where both apply to one thread;
    returns what was set (None: nothing)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return "nice 19"
    except (AttributeError, OSError):
        return None


def _check_replies(data: bytes, client: ClientConnection, expected: int) -> str | None:
    """Why the warm-up's replies, read by the scripted client's connection, are not the script's
    (or None): a refusal, an error, too few."""
    parser = HelloReplyParser()
    try:
        if parser.feed(data) is None:
            return "no version exchange"
        client.feed(parser.unused)
        count = 0
        while True:
            frame = client.next_frame()
            if frame is None:
                break
            reply = client.reply_of(frame, P.DATA if frame.type == P.DATA else P.RETURN)
            count += 1
            if frame.type == P.DATA:
                client.take(reply)
    except RemoteError as exc:
        return f"{exc.type_name}: {exc.remote_message}"
    except Exception as exc:        # noqa: BLE001 (reported, never fatal)
        return f"{type(exc).__name__}: {exc}"
    return None if count == expected else f"{count} replies, not {expected}"


def _receive_handoff(control: socket.socket) -> tuple[socket.socket, float | None, bytes] | None:
    """Wait for the server's handoff; None when the server closed the link instead."""
    data, fds, _, _ = socket.recv_fds(control, MAX_HANDOFF_BYTES, 1)
    try:
        while len(data) < 4 or len(data) < _HANDOFF.unpack_from(data)[0] + 4:
            if not data and not fds:
                return None
            if len(data) > MAX_HANDOFF_BYTES:
                raise ValueError("handoff too long")
            more = control.recv(MAX_HANDOFF_BYTES)
            if not more:
                raise ValueError(f"the server's handoff ended after {len(data)} bytes")
            data += more
        if len(fds) != 1:
            raise ValueError(f"the handoff carried {len(fds)} descriptors, not 1")
        timeout, initial = decode_handoff(data)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return socket.socket(fileno=fds[0]), timeout, initial


def is_spare(pid: int, ready: bool = False) -> bool:
    """Whether process ``pid`` is a spare session child before its session (Linux); with
    ``ready``, one that is warm (the next session is handed to it)."""
    name = process_tree.process_name(pid)
    return name == PROCESS_NAME or (not ready and name == WARMING_NAME)


def _spare_main(control: socket.socket, config: ServerConfig, workspace: Workspace, idle: bool) -> bool:
    try:
        os.chdir(workspace.root)
    except FileNotFoundError:       # the server gave this spare up before the forker's answer came
        return False
    own_name = process_tree.process_name()
    if own_name is not None:
        process_tree.set_process_name(WARMING_NAME)
    faults = _warm_up_in_background(config, workspace) if idle else warm_up(config, workspace)
    gc.freeze()                     # what the warm-up left, too (see session.child_main)
    log.debug("spare session child %d warmed up (%d page faults)", os.getpid(), faults)
    control.sendall(READY)
    if own_name is not None:
        process_tree.set_process_name(PROCESS_NAME)
    handoff = _receive_handoff(control)
    if handoff is None:
        return False
    control.close()
    if own_name is not None:
        process_tree.set_process_name(own_name)     # a session child like any other
    sock, timeout, initial = handoff
    run_session(sock, workspace, config, timeout, initial)
    return True


def _spare_payload(workspace: Workspace, idle: bool) -> bytes:
    return (b"1" if idle else b"0") + os.fsencode(workspace.root)


def _spare_body(config: ServerConfig, fds: list[int], payload: bytes):
    """What a spare forked by the forker runs (``fds``: its link, its status pipe)."""
    idle, root = payload[:1] == b"1", os.fsdecode(payload[1:])
    return lambda: _spare_main(socket.socket(fileno=fds[0]), config, Workspace(root), idle)


class SpareGone(Exception):
    """The spare cannot take the session (it died, or its link broke)."""


class Spare:
    """The server's view of one spare child, from its fork to its handoff."""

    def __init__(self, config: ServerConfig, idle: bool = False, forker: Forker | None = None) -> None:
        """``idle``: it warms up at the lowest CPU priority from the start (sessions run);
        ``forker``: the process that forks it (else the server does), its pid then unknown
        until the forker answers (:meth:`forked`)."""
        self.workspace = new_workspace(config)
        control, child_end = socket.socketpair()
        status_r, status_w = os.pipe()
        pid = None
        try:
            if forker is not None:
                forker.request([child_end.fileno(), status_w], _spare_payload(self.workspace, idle))
            else:
                pid = fork_child(config, (child_end.fileno(), status_w), status_w,
                                 lambda: _spare_main(child_end, config, self.workspace, idle))
        except BaseException:
            self.workspace.remove()
            control.close()
            os.close(status_r)
            raise
        finally:
            child_end.close()
            os.close(status_w)
        os.set_blocking(status_r, False)
        control.setblocking(False)
        self.control = control
        self.pid: int | None = None
        self.done = False               # reaped, or handed over (then its session's)
        self._ready = False             # it said so (READY)
        self._link_closed = False
        self._status_fd = status_r
        self._pidfd = None
        if pid is not None:
            self.forked(pid)

    def forked(self, pid: int) -> None:
        self.pid = pid
        self._pidfd = pidfd_of(pid)

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when the spare exits (None: ask ``exited``)."""
        return self._pidfd

    def ready(self) -> bool:
        """Whether the spare has warmed up (it said so on its link) and is the server's child."""
        if not self._ready and not self._link_closed and self.pid is not None:
            try:
                data = self.control.recv(1)
            except OSError:     # nothing yet (BlockingIOError), or the link broke
                return False
            self._ready = data == READY
            self._link_closed = not data
        return self._ready

    def listening(self) -> bool:
        """Whether its link may still say something (a selector watches it until then)."""
        return not self.ready() and not self._link_closed

    def exited(self) -> int | None:
        """The spare's wait status once it has exited (it is reaped then), else None."""
        if self.pid is None:
            return None
        try:
            running = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:       # forked by the forker, not adopted yet
            return None
        if running:
            return None
        kill_group(self.pid)                    # what it started, if anything
        _, status = os.waitpid(self.pid, 0)
        self._close()
        return status

    def hand_over(self, sock: socket.socket, client_key: ParsedKey, config: ServerConfig,
                  initial: bytes = b"", peer: str | None = None) -> SessionProcess:
        """Give the spare this session; SpareGone (and the spare ended) if it cannot take it."""
        status = self.exited()
        if status is not None:
            raise SpareGone(f"it had exited ({_describe(status)})")
        timeout = config.effective_timeout(client_key.timeout)
        message = encode_handoff(timeout, initial)
        try:
            sent = socket.send_fds(self.control, [message], [sock.fileno()])
            if sent != len(message):
                raise OSError(f"only {sent} of the handoff's {len(message)} bytes went out")
        except OSError as exc:
            self.kill()
            raise SpareGone(f"the handoff failed: {exc}") from None
        self.done = True
        self.control.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return SessionProcess(self.pid, sock, self.workspace, timeout, peer_of(sock, peer), self._status_fd)

    def kill(self) -> None:
        """End it; one not forked yet ends at its closed link (or the server's orphan sweep)."""
        if self.done:
            return
        if self.pid is not None:
            kill_and_reap(self.pid)
        self._close()

    def _close(self) -> None:
        self.done = True
        if self.pid is not None:
            _session.child_ended(self.pid)
        self.workspace.remove()
        self.control.close()
        os.close(self._status_fd)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(sig).name}"
        except ValueError:
            return f"signal {sig}"
    return f"exit code {os.WEXITSTATUS(status)}"


FORKER_ANSWER_WAIT = 5.0
"""Seconds a blocking server waits for the forker's answer (forking takes a few milliseconds)."""


class Spares:
    """At most one spare session child, and the start of every session: through the spare when
    there is one and it is warm, else by a child forked for it (logged: ``fallbacks`` counts
    them); a spare that is still warming up is kept for the next session."""

    def __init__(self, config: ServerConfig, blocking: bool = False) -> None:
        """Also the server's own warm-up (:func:`warm_up_server`): before the first session child
        is forked, whether a spare or at connect. ``blocking``: :meth:`fill` waits for the
        forker's answer (a server with no selector to watch for it: through a proxy)."""
        warm_up_server(config)
        self.config = config
        self.blocking = blocking
        self.enabled = config.spare_session
        self.forker: Forker | None = None        # started with the first spare, after the ready line
        self._forker_started = False
        self._selector: selectors.BaseSelector | None = None
        self.spare: Spare | None = None
        self.fallbacks = 0
        self._refill_at = 0.0
        self._delay = REFILL_DELAY

    def fill(self, idle: bool = False) -> Spare | None:
        """Fork a spare if there is none (and none died too recently); returns the new one.
        ``idle``: sessions run, so it warms up at the lowest CPU priority."""
        if not self.enabled or self.spare is not None or time.monotonic() < self._refill_at:
            return None
        if not self._forker_started:
            self._start_forker()
        try:
            try:
                self.spare = Spare(self.config, idle, self.forker)
            except ForkerGone as exc:
                self._forker_gone(exc)
                self.spare = Spare(self.config, idle)
        except OSError as exc:         # no memory or processes left, the workspace root full
            self._lost(f"could not fork a spare session child: {exc}")
            return None
        if self.spare.pid is None:
            log.debug("spare session child asked of the forker")
            if self.blocking:
                self._await_answer(time.monotonic() + FORKER_ANSWER_WAIT)
        else:
            log.debug("spare session child %d forked", self.spare.pid)
        return self.spare

    def forked(self) -> None:
        """Take the forker's answer (its socket is readable)."""
        spare = self.spare if self.spare is not None and self.spare.pid is None else None
        try:
            pid = self.forker.answer()
        except ForkerGone as exc:
            self._forker_gone(exc)
            if spare is not None:
                spare.kill()
                self.spare = None       # the next fill forks one
            return
        except OSError as exc:
            if spare is not None:
                spare.kill()
                self._lost(f"could not fork a spare session child: {exc}")
            return
        if pid is None:
            return
        if spare is None:               # asked for by a spare that is no more
            kill_and_reap(pid)
            _session.child_ended(pid)
        else:
            spare.forked(pid)
            log.debug("spare session child %d forked by the forker", pid)

    def _await_answer(self, deadline: float) -> None:
        while self.spare is not None and self.spare.pid is None and time.monotonic() < deadline:
            select.select([self.forker.fileno()], [], [], deadline - time.monotonic())
            self.forked()

    def watch_forker(self, selector: selectors.BaseSelector) -> None:
        """Take the forker's answers as they come (:meth:`forked`), in the server's loop."""
        self._selector = selector

    def _forker_gone(self, exc: ForkerGone) -> None:
        log.warning("%s; the server forks its spares itself from now on", exc)
        if self._selector is not None:
            self._selector.unregister(self.forker.fileno())     # before its number is someone else's
        self.forker.close()
        self.forker = None

    def next_fill(self) -> float | None:
        """When ``fill`` will fork again after a spare died (None: not waiting for that)."""
        if not self.enabled or self.spare is not None or self._refill_at <= time.monotonic():
            return None
        return self._refill_at

    def check(self) -> bool:
        """Reap the spare if it died before its handoff (logged); True if it did."""
        if self.spare is None:
            return False
        status = self.spare.exited()
        if status is None:
            return False
        self._lost(f"spare session child {self.spare.pid} died before its session ({_describe(status)})")
        return True

    def _lost(self, what: str) -> None:
        self.spare = None
        self._refill_at = time.monotonic() + self._delay
        log.warning("%s; the next spare in %.1fs", what, self._delay)
        self._delay = min(self._delay * 2, MAX_REFILL_DELAY)

    def start(self, sock: socket.socket, client_key: ParsedKey, config: ServerConfig,
              initial: bytes = b"", peer: str | None = None) -> SessionProcess:
        """The session's child: the spare, or (when there is none, it is gone or still warming
        up) a fresh fork."""
        spare = self.spare
        if spare is not None and not spare.ready():
            status = spare.exited()
            if status is None:
                reason, level = f"the spare ({spare.pid}) was still warming up", logging.INFO
            else:
                self._lost(f"spare session child {spare.pid} died before its session ({_describe(status)})")
                reason, level = "its spare was gone", logging.WARNING
        elif spare is not None:
            self.spare = None
            try:
                session = spare.hand_over(sock, client_key, config, initial, peer)
                self._delay = REFILL_DELAY
                return session
            except SpareGone as exc:
                self._lost(f"spare session child {spare.pid} could not take the session: {exc}")
                reason, level = "its spare was gone", logging.WARNING
        elif self.enabled:
            reason, level = "no spare was ready", logging.INFO   # sessions queued: each slot is taken at once
        else:
            return start_session(sock, client_key, config, initial, peer)
        self.fallbacks += 1
        log.log(level, "session for %s: %s; forked a child for it (fallback %d)",
                peer_of(sock, peer), reason, self.fallbacks)
        return start_session(sock, client_key, config, initial, peer)

    def wait_warm(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the spare to end its warm-up (a server that serves
        one session at a time, blocking: through a proxy)."""
        deadline = time.monotonic() + timeout
        while self.spare is not None and time.monotonic() < deadline:
            if self.spare.pid is None:
                self._await_answer(deadline)
            elif self.spare.listening():
                select.select([self.spare.control], [], [], deadline - time.monotonic())
            else:
                break

    def close(self) -> None:
        """End the spare and the forker (the server stops)."""
        if self.spare is not None:
            self.spare.kill()
            self.spare = None
        if self.forker is not None:
            self.forker.close()
            self.forker = None

    def _start_forker(self) -> None:
        self._forker_started = True
        try:
            self.forker = Forker(self.config, lambda fds, payload: _spare_body(self.config, fds, payload))
        except OSError as exc:
            log.info("no forker (%s): the server forks its spares itself", exc)
            return
        if self._selector is not None:
            self._selector.register(self.forker.fileno(), selectors.EVENT_READ, lambda _: self.forked())
