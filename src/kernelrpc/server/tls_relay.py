"""TLS sessions: a small relay process holds the TLS stream, the session child speaks plain.

The parent of a session keeps its copy of the client's connection so that it can tell
the client, in a typed notice, that the session child crashed or ran out of time
(:mod:`.session`). Over TLS it cannot: the TLS state (keys, sequence numbers) lives
in whichever process holds the stream, and a crashed child takes it along. So a TLS
session is three processes:

    client ==TLS== relay --plain socketpair-- session child
                             ^
                             parent (its copy of the socketpair end: notices)

The relay, forked from the server right after the TLS and RPC handshakes, moves
bytes both ways and nothing else: it never parses them, runs no uploaded code and
keeps the server's user (not ``--run-as``), so a session cannot reach into it. The
session child is the unchanged one of a plain connection, on its end of the
socketpair; the parent's notice goes into the socketpair and reaches the client
through the relay like any reply. The relay ends when both directions are done (the
client hung up, or the session side closed), drains the client's last bytes for a
moment so that its final notice is not lost to a reset, and dies with the server
(``PR_SET_PDEATHSIG``). Its cost is measured in ``bench/tls.py``.

Standard library only, like the rest of the device server.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import ssl
import time

from ..wire.handshake import ParsedKey
from .config import ServerConfig
from . import process_tree
from . import session as _session
from .session import SessionProcess, close_all_but, start_session

log = logging.getLogger(__name__)

CHUNK = 256 << 10
"""Bytes read at a time, and buffered at most per direction."""
LINGER = 2.0
"""Seconds the relay reads (and drops) what the client still sends after the session ended."""
STALL = 30.0
"""Seconds without progress after which a relay with bytes to deliver gives up (no --io-timeout)."""


class Relay:
    """The parent's view of a relay process: reap it once it has ended.

    While it runs, its pid is among the server's live children (``session.own_child``): the
    server kills every other child it finds when a session ends (what sessions left behind).
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.done = False
        _session.own_child(pid)

    def reap(self, wait: float = 0.0) -> bool:
        """True once the relay has exited and is reaped; waits up to ``wait`` seconds, then kills it."""
        deadline = time.monotonic() + wait
        while not self.done:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid = self.pid
            if pid:
                self._reaped()
                break
            if time.monotonic() >= deadline:
                if wait:
                    self.kill()
                    continue
                return False
            time.sleep(0.01)
        return True

    def kill(self) -> None:
        _session.kill_and_reap(self.pid, group=False)
        self._reaped()

    def _reaped(self) -> None:
        self.done = True
        _session.child_ended(self.pid)


def start_tls_session(tls_sock: ssl.SSLSocket, client_key: ParsedKey, config: ServerConfig,
                      initial: bytes, peer: str, start=start_session) -> tuple[SessionProcess, Relay]:
    """Fork the relay for the handshaken ``tls_sock``, then start the session child on the plain
    side with ``start`` (``start_session``'s arguments; a spare's handoff, ``Spares.start``)."""
    session_end, relay_end = socket.socketpair()
    server_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            session_end.close()
            _relay_main(tls_sock, relay_end, config, server_pid)
            code = 0
        except BaseException:
            log.exception("TLS relay for %s failed", peer)
        finally:
            os._exit(code)
    relay = Relay(pid)
    relay_end.close()
    tls_sock.close()        # only our descriptor: closing sends nothing, the relay goes on
    try:
        session = start(session_end, client_key, config, initial, peer)
    except BaseException:
        session_end.close()
        relay.reap(1.0)
        raise
    return session, relay


def _relay_main(tls_sock: ssl.SSLSocket, plain: socket.socket, config: ServerConfig, server_pid: int) -> None:
    try:
        os.setpgid(0, 0)            # not in the terminal's group: Ctrl-C is for the server
    except OSError:
        pass
    process_tree.set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before the signal was armed
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    close_all_but((tls_sock.fileno(), plain.fileno()))
    relay(tls_sock, plain, config.io_timeout or STALL)


_IN = select.POLLIN | select.POLLHUP | select.POLLERR   # an error or hang-up shows on the next recv
_OUT = select.POLLOUT | select.POLLHUP | select.POLLERR


def relay(tls_sock: ssl.SSLSocket, plain: socket.socket, stall: float) -> None:
    """Move bytes between ``tls_sock`` and ``plain`` until both directions have ended.

    Each read is followed by a write attempt at once (the target is usually writable, and
    waiting for ``poll`` to say so costs a wake-up); ``poll`` on the two descriptors (not
    ``selectors``, whose bookkeeping cost as much as the copying) waits for the rest.
    """
    tls_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # what run_session does for plain TCP
    tls_sock.setblocking(False)
    plain.setblocking(False)
    up = _Direction(tls_sock, plain)      # client -> session
    down = _Direction(plain, tls_sock)    # session -> client
    tls_fd, plain_fd = tls_sock.fileno(), plain.fileno()
    poller = select.poll()
    masks = {tls_fd: 0, plain_fd: 0}
    for fd in masks:
        poller.register(fd, 0)
    progress = time.monotonic()
    while not down.finished:
        moved = up.drain_tls() | down.drain_tls()   # decrypted bytes wait in the SSL object, unseen by poll
        if up.finished and not up.shut:
            up.shut = True
            _shutdown(plain)          # the session child sees the client's hang-up
        for fd, mask in ((tls_fd, up.read_mask | down.write_mask), (plain_fd, down.read_mask | up.write_mask)):
            if masks[fd] != mask:
                poller.modify(fd, mask)
                masks[fd] = mask
        for fd, events in poller.poll(1000):
            source, sink = (up, down) if fd == tls_fd else (down, up)
            if events & _IN and source.read_mask:
                moved |= source.pump()
            if events & _OUT and sink.write_mask:
                moved |= sink.write()
        now = time.monotonic()
        if moved:
            progress = now
        elif (up.buffer or down.buffer) and now - progress > stall:
            log.warning("TLS relay: no progress for %g s with bytes to deliver; giving up", stall)
            break
    if down.target_open:
        _linger(tls_sock)


class _Direction:
    """Bytes from ``source`` to ``target``, at most :data:`CHUNK` buffered."""

    def __init__(self, source: socket.socket, target: socket.socket) -> None:
        self.source = source
        self.target = target
        self.buffer = bytearray()
        self.source_open = True
        self.target_open = True
        self.shut = False

    @property
    def finished(self) -> bool:
        """Nothing more will come and everything has been delivered (or cannot be)."""
        return not self.source_open and (not self.buffer or not self.target_open)

    @property
    def read_mask(self) -> int:
        return _IN if self.source_open and len(self.buffer) < CHUNK else 0

    @property
    def write_mask(self) -> int:
        return _OUT if self.buffer and self.target_open else 0

    def drain_tls(self) -> bool:
        moved = False
        while (isinstance(self.source, ssl.SSLSocket) and self.read_mask and self.source.pending() > 0
               and self.pump()):
            moved = True
        return moved

    def pump(self) -> bool:
        """Read what the source has, then try to write it on at once."""
        moved = self.read()
        if self.buffer:
            moved |= self.write()
        return moved

    def read(self) -> bool:
        """Take what the source has, up to :data:`CHUNK` (a TLS socket hands out one record,
        at most 16 KiB, per call: several are gathered so that the write after is one call)."""
        moved = False
        while self.source_open and len(self.buffer) < CHUNK:
            try:
                data = self.source.recv(CHUNK - len(self.buffer))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                data = b""
            moved = True
            if not data:
                self.source_open = False
            self.buffer += data
            if not isinstance(self.source, ssl.SSLSocket):
                break
        return moved

    def write(self) -> bool:
        try:
            sent = self.target.send(self.buffer)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False
        except OSError:
            self.target_open = False
            self.buffer.clear()
            return True
        del self.buffer[:sent]
        return sent > 0


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _linger(tls_sock: ssl.SSLSocket) -> None:
    """End the TLS stream, then read what the client still sends, for :data:`LINGER` seconds
    in all: closing with unread bytes would reset the connection and could lose the last
    notice on the way."""
    deadline = time.monotonic() + LINGER
    try:
        tls_sock.setblocking(True)
        tls_sock.settimeout(LINGER)
        tls_sock.unwrap()       # close_notify; returns once the client answers with its own
    except (OSError, ValueError):
        pass
    if tls_sock.fileno() < 0:
        return
    raw = socket.socket(fileno=os.dup(tls_sock.fileno()))    # past TLS: the bytes are only drained
    try:
        raw.shutdown(socket.SHUT_WR)
        while time.monotonic() < deadline:
            raw.settimeout(max(0.01, deadline - time.monotonic()))
            if not raw.recv(65536):
                break
    except OSError:
        pass
    finally:
        raw.close()
