"""The server's accept loop: non-blocking handshakes, one child process per session.

A connection first completes TVM's handshake here, without blocking: a peer
that stays silent is dropped at its deadline and never holds up others. Clients
whose key matches wait in arrival order for a free session slot
(``max_sessions``, default 1, so measurements never overlap), then get the
success reply and their session child.

With TLS (``config.tls``) the TLS handshake runs here too, non-blocking and within
the same deadline, before the RPC handshake; a first byte that cannot start a TLS
hello gets :data:`~kernelrpc.wire.tls.PLAINTEXT_REFUSAL`. The session then runs
behind a TLS relay process (:mod:`.tls_relay`), so that crash and timeout notices
still reach the client.

Each session's child is normally a spare (:mod:`.spare`): forked and warmed up ahead, then handed
the connection. The next spare is forked when a slot is free, or as soon as a session's child
says the session is over, before it exits and is reaped, so that a client that connects again
at once finds it warm (or almost: it waits a little for it).
"""
from __future__ import annotations

import collections
import logging
import selectors
import signal
import socket
import ssl
import time

from ..acceptor import Acceptor
from ..wire import handshake as H
from ..wire.opening import (Accept, ConnectionClosed, DataReceived, OpeningConfig, OpeningMachine, Preamble,
                            Refusal, Reject, Send, StartTLS, TimerFired, TLSEstablished, TLSFailed)
from ..wire.opening import State as OpeningState
from ..wire.tls import close_gently
from .config import ServerConfig
from .session import SessionProcess
from .spare import WARM_UP_WAIT, Spares
from .tls_relay import Relay, start_tls_session
from .workspace import remove_stale

log = logging.getLogger(__name__)

FIRST_WARM_UP_WAIT = 2.0
"""Seconds the server waits at its start, after its ready line, for its first spare's warm-up (a
few milliseconds), before it accepts connections."""


def dispatch(selector: selectors.BaseSelector, events) -> None:
    """Run the callback of each event of one ``select()``, skipping the stale ones: an event whose
    file an earlier callback of the same batch unregistered (a connection handed to the spare that
    just became warm, a dropped one, a plain socket that its TLS socket replaced) would otherwise
    run on a closed socket and end the server."""
    registered = selector.get_map()
    for key, _ in events:
        if registered.get(key.fd) is key:
            key.data(key.fileobj)


class _Pending:
    """A connection in the middle of the handshake."""

    def __init__(self, sock: socket.socket, addr, opening: OpeningMachine) -> None:
        self.sock = sock
        self.peer = "%s:%s" % addr[:2]
        self.opening = opening
        self.key: H.ParsedKey | None = None    # set once its opening is accepted
        self.extra = b""
        self.admitted = 0.0                      # when its key matched (it waits for a slot from then)


def _check_key(key: str) -> H.ParsedKey:
    parsed = H.parse_key(key)
    parsed.timeout  # validates -timeout= now, while we can still refuse cleanly
    return parsed


_REFUSALS = {
    Refusal.PLAINTEXT: "it spoke plain TCP to this TLS server (%s); told it TLS is required",
    Refusal.TLS_FAILED: "the TLS handshake failed: %s",
    Refusal.TLS_UNEXPECTED: "it speaks TLS, and this server runs without TLS (--tls-cert)%.0s",
    Refusal.BAD_PREAMBLE: "%s",
    Refusal.BAD_KEY: "%s",
    Refusal.AUTH_FAILED: "%s",
}
"""How the server logs each refusal (the detail fills the %s)."""


class Server:
    def __init__(self, config: ServerConfig, listen_sock: socket.socket, registration=None) -> None:
        self.config = config
        self.listen_sock = listen_sock
        self.registration = registration
        self.selector = selectors.DefaultSelector()
        self.pending: dict[socket.socket, _Pending] = {}
        self.waiting: collections.deque[_Pending] = collections.deque()
        self.sessions: list[SessionProcess] = []
        self._watched: dict[SessionProcess, int] = {}  # session -> its registered pidfd
        self._ending: dict[SessionProcess, int | None] = {}  # session -> its status pipe until it says it ends
        self.relays: list[Relay] = []                  # TLS sessions' relay processes
        self.tls = config.tls.server_context() if config.tls is not None else None
        self._opening_config = OpeningConfig(Preamble.RPC, tls=self.tls is not None, auth_token=config.auth_token,
                                             timeout=config.handshake_timeout, check_key=_check_key)
        self.spares = Spares(config)
        self._spare_watched: list = []                 # the spare's pidfd, and its link until it is warm
        self._stopping = False
        listen_sock.setblocking(False)
        self.acceptor = Acceptor(listen_sock)
        self.selector.register(listen_sock, selectors.EVENT_READ, self._accept)
        if registration is not None:
            registration.attach(self.selector)   # tracker replies wake the loop; no polling
        remove_stale(config.workspace_root)

    @property
    def address(self) -> tuple[str, int]:
        return self.listen_sock.getsockname()[:2]

    def matchkey(self) -> str:
        if self.registration is not None and self.registration.matchkey is not None:
            return self.registration.matchkey
        return self.config.key

    def stop(self) -> None:
        self._stopping = True

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the loop promptly: the wakeup fd interrupts the selector."""
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._wakeup = (wake_r, wake_w)
        self.selector.register(wake_r, selectors.EVENT_READ, lambda s: s.recv(512))
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def serve_forever(self) -> None:
        try:
            self.spares.fill()          # the first client (in the listen backlog meanwhile) finds it warm
            self.spares.wait_warm(FIRST_WARM_UP_WAIT)
            self._on_tick()
            while not self._stopping:
                dispatch(self.selector, self.selector.select(self._next_timeout()))
                self._on_tick()
        finally:
            self.close()

    def close(self) -> None:
        self._unwatch_spare()
        self.spares.close()
        for session in self.sessions:
            session.kill()
        self.sessions.clear()
        deadline = time.monotonic() + 2.0      # let relays deliver the shutdown notices
        for relay in self.relays:
            relay.reap(max(0.01, deadline - time.monotonic()))
        self.relays.clear()
        for pending in list(self.pending.values()):
            self._drop(pending)
        if self.registration is not None:
            self.registration.close()
        self.selector.close()
        self.listen_sock.close()

    # ------------------------------------------------------------ loop plumbing

    def _next_timeout(self) -> float:
        deadlines = [p.opening.deadline for p in self.pending.values() if p.key is None]
        deadlines += [s.deadline for s in self.sessions if s.deadline is not None]
        if any(s not in self._watched for s in self.sessions):
            deadlines.append(time.monotonic() + 0.05)
        if self.registration is not None:
            deadlines.append(self.registration.next_deadline())
        if self.acceptor.paused_until is not None:
            deadlines.append(self.acceptor.paused_until)
        if self.spares.next_fill() is not None:
            deadlines.append(self.spares.next_fill())
        if self.waiting and self._spare_warming():
            deadlines.append(self.waiting[0].admitted + WARM_UP_WAIT)
        if not deadlines:
            return 1.0
        return max(0.0, min(deadlines) - time.monotonic())

    def _on_tick(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self.pending.values() if p.key is None and now >= p.opening.deadline]:
            self._opening(pending, TimerFired())
        for session in list(self.sessions):
            if session.expire_if_due(now) or (session not in self._watched and session.poll()):
                self._session_over(session)
        if self.relays:
            self.relays = [relay for relay in self.relays if not relay.reap()]
        if self.registration is not None:
            self.registration.tick()
        if self.acceptor.paused_until is not None and now >= self.acceptor.paused_until:
            self.acceptor.resume()
            self.selector.register(self.listen_sock, selectors.EVENT_READ, self._accept)
        self._start_waiting()
        running = len(self.sessions) - sum(fd is None for fd in self._ending.values())
        if running < self.config.max_sessions and not self._stopping:
            self.spares.fill(idle=running > 0)      # a free slot, or one that its session is leaving
        self._watch_spare()

    def _watch_spare(self) -> None:
        """Watch the spare for its death and for the end of its warm-up."""
        spare = self.spares.spare
        if spare is None or self._spare_watched:
            return
        if spare.fileno() is not None:
            self.selector.register(spare.fileno(), selectors.EVENT_READ, self._spare_event)
            self._spare_watched.append(spare.fileno())
        if spare.listening():
            self.selector.register(spare.control, selectors.EVENT_READ, self._spare_warm)
            self._spare_watched.append(spare.control)

    def _spare_event(self, fd: int) -> None:
        self._unwatch_spare()
        self.spares.check()     # it died before its handoff: the next tick forks another

    def _spare_warm(self, control) -> None:
        """The spare's link has something: its word that it is warm (a client may wait for it),
        or the end of the link (its death, which its pidfd reports)."""
        spare = self.spares.spare
        if spare is not None and spare.control is control and not spare.listening():
            self.selector.unregister(control)
            self._spare_watched.remove(control)

    def _spare_warming(self) -> bool:
        spare = self.spares.spare
        return spare is not None and not spare.ready()

    def _unwatch_spare(self) -> None:
        for watched in self._spare_watched:
            self.selector.unregister(watched)
        self._spare_watched.clear()

    def _accept(self, listen_sock: socket.socket) -> None:
        conn = self.acceptor.accept()
        if conn is None:
            if self.acceptor.paused_until is not None:  # out of descriptors: serve the sessions we have
                self.selector.unregister(listen_sock)
            return
        sock, addr = conn
        if len(self.pending) >= self.config.max_pending and not self._evict_unfinished_handshake():
            log.warning("refusing %s: %d connections already wait for a session", addr, len(self.pending))
            sock.close()
            return
        sock.setblocking(False)
        pending = _Pending(sock, addr, OpeningMachine(self._opening_config, time.monotonic()))
        self.pending[sock] = pending
        self.selector.register(sock, selectors.EVENT_READ, self._read_pending)

    def _read_pending(self, sock: socket.socket) -> None:
        pending = self.pending[sock]
        state = pending.opening.state
        if state is OpeningState.SNIFF or state is OpeningState.TLS:
            if not self._open_tls(pending):
                return
            sock = pending.sock
        while True:
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                data = b""
            self._received(pending, data)
            # bytes TLS decrypted ahead wait in the SSL object, where the selector cannot see them
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending() and self.pending.get(sock) is pending):
                return

    def _open_tls(self, pending: _Pending) -> bool:
        """Look at the first byte (left in the socket), then advance the TLS handshake by what
        has arrived; True once it is done."""
        if pending.opening.state is OpeningState.SNIFF:
            try:
                first = pending.sock.recv(1, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                first = b""
            self._opening(pending, ConnectionClosed() if not first else DataReceived(first))
            if pending.opening.state is not OpeningState.TLS:
                return False
        sock = pending.sock
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self.selector.modify(sock, selectors.EVENT_READ, self._read_pending)
            return False
        except ssl.SSLWantWriteError:
            self.selector.modify(sock, selectors.EVENT_WRITE, self._read_pending)
            return False
        except OSError as exc:      # ssl.SSLError included: no or a wrong client certificate, not TLS
            self._opening(pending, TLSFailed(str(exc)))
            return False
        self._opening(pending, TLSEstablished())
        self.selector.modify(sock, selectors.EVENT_READ, self._read_pending)
        return True

    def _start_tls(self, pending: _Pending) -> bool:
        """Put the TLS socket in the plain one's place (its first bytes are still unread)."""
        sock = pending.sock
        del self.pending[sock]
        self.selector.unregister(sock)
        try:
            pending.sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError as exc:
            log.info("dropping %s: %s", pending.peer, exc)
            sock.close()
            return False
        self.pending[pending.sock] = pending
        self.selector.register(pending.sock, selectors.EVENT_READ, self._read_pending)
        return True

    def _received(self, pending: _Pending, data: bytes) -> None:
        if not data:
            self._drop(pending)
        elif pending.key is not None:  # bytes sent before our reply: keep them for the session
            pending.extra += data
            if len(pending.extra) > 1 << 16:
                self._drop(pending)
        else:
            self._opening(pending, DataReceived(data))

    def _opening(self, pending: _Pending, event) -> None:
        """Drive the opening machine (wire/opening.py) with ``event``; do what it says."""
        for action in pending.opening.handle(event, time.monotonic()):
            kind = type(action)
            if kind is Send:
                if not self._reply(pending, action.data):
                    self._drop(pending)
                    return
            elif kind is StartTLS:
                if not self._start_tls(pending):
                    pending.opening.handle(ConnectionClosed(), 0.0)
                    return
            elif kind is Accept:
                self._admit(pending, action.checked, action.leftover)
            elif kind is Reject:
                self._rejected(pending, action)

    def _rejected(self, pending: _Pending, reject: Reject) -> None:
        message = _REFUSALS.get(reject.refusal)
        if message is not None:
            level = logging.INFO if reject.refusal in (Refusal.BAD_PREAMBLE, Refusal.BAD_KEY) else logging.WARNING
            log.log(level, "refusing %s: " + message, pending.peer, reject.detail)
        elif reject.refusal is Refusal.TIMEOUT:
            log.info("dropping %s: no handshake within %.1fs", pending.peer, self.config.handshake_timeout)
        if reject.reply:
            self._reply(pending, reject.reply)
        if not reject.gently:
            self._drop(pending)
        elif self.pending.pop(pending.sock, None) is not None:
            self.selector.unregister(pending.sock)
            close_gently(pending.sock)      # the refusal or the alert that says why must not be lost to a reset

    def _admit(self, pending: _Pending, parsed: H.ParsedKey, extra: bytes) -> None:
        pending.key = parsed
        pending.admitted = time.monotonic()
        pending.extra = extra
        if not self._key_matches(parsed):
            log.info("key mismatch from %s (role %r)", pending.peer, parsed.role)
            self._reply(pending, H.encode_reply(H.RPC_CODE_MISMATCH))
            self._drop(pending)
            return
        self.waiting.append(pending)

    def _key_matches(self, parsed: H.ParsedKey) -> bool:
        return parsed.role == "client" and parsed.matchkey == self.matchkey()

    def _start_waiting(self) -> None:
        while self.waiting and len(self.sessions) < self.config.max_sessions:
            pending = self.waiting[0]
            if pending.sock in self.pending and self._spare_warming() \
                    and time.monotonic() < pending.admitted + WARM_UP_WAIT:
                return    # the spare is almost warm: worth waiting for (spare.WARM_UP_WAIT)
            self.waiting.popleft()
            if pending.sock not in self.pending:
                continue  # it hung up while waiting
            if not self._key_matches(pending.key):  # the matchkey rotated while it waited
                self._reply(pending, H.encode_reply(H.RPC_CODE_MISMATCH))
                self._drop(pending)
                continue
            self.selector.unregister(pending.sock)
            del self.pending[pending.sock]
            success = H.encode_reply(H.RPC_CODE_SUCCESS, "server:" + self.config.key)
            self._unwatch_spare()       # its pidfd is the session's now, or closed (the tick watches a kept one)
            if isinstance(pending.sock, ssl.SSLSocket):   # the reply first: then the relay owns the stream
                if not self._reply(pending, success):
                    pending.sock.close()
                    continue
                session, relay = start_tls_session(pending.sock, pending.key, self.config, pending.extra,
                                                   pending.peer, start=self.spares.start)
                self.relays.append(relay)
            else:   # the child first: a spare wakes up while the reply travels and the hello comes back
                session = self.spares.start(pending.sock, pending.key, self.config, pending.extra)
                if not self._reply(pending, success):
                    session.kill()
                    continue
            log.info("session for %s starts (child %d)", pending.peer, session.pid)
            self.sessions.append(session)
            if session.fileno() is not None:
                self._watched[session] = session.fileno()
                self.selector.register(session.fileno(), selectors.EVENT_READ, self._session_event)
            self._ending[session] = session.status_fileno()
            self.selector.register(session.status_fileno(), selectors.EVENT_READ, self._session_ending)
            if self.registration is not None:
                self.registration.session_started()

    def _session_event(self, fd: int) -> None:
        for session, watched in list(self._watched.items()):
            if watched == fd and session.poll():
                self._session_over(session)
                return

    def _session_ending(self, fd: int) -> None:
        """A session's child said the session is over (or died): the next spare can be forked
        while it exits and the server cleans up after it."""
        for session, status in self._ending.items():
            if status == fd:                # (not a session reaped earlier in this round)
                self.selector.unregister(fd)
                self._ending[session] = None
                return

    def _session_over(self, session: SessionProcess) -> None:
        self.sessions.remove(session)
        fd = self._watched.pop(session, None)
        if fd is not None:
            self.selector.unregister(fd)  # the pidfd is closed already; this drops the selector's entry
        status = self._ending.pop(session, None)
        if status is not None:
            self.selector.unregister(status)
        if self.registration is not None:
            self.registration.session_finished()

    @staticmethod
    def _reply(pending: _Pending, data: bytes) -> bool:
        """Send a short handshake reply; a peer whose buffer is full is not worth waiting for."""
        try:
            return pending.sock.send(data) == len(data)
        except OSError:
            return False

    def _evict_unfinished_handshake(self) -> bool:
        """Make room by dropping the oldest peer that has not finished its handshake.

        A flood of silent connections then cannot use up the server's descriptors or keep a
        client that completes its handshake promptly from getting in.
        """
        for pending in self.pending.values():
            if pending.key is None:
                log.info("dropping %s: too many unfinished handshakes", pending.peer)
                self._drop(pending)
                return True
        return False

    def _drop(self, pending: _Pending) -> None:
        if self.pending.pop(pending.sock, None) is not None:
            self.selector.unregister(pending.sock)
        pending.sock.close()
