"""The server's loop: one child process per session, for the clients whose opening succeeded.

A connection's opening (TLS, TVM's handshake, the auth challenge) runs in :mod:`.openings`,
without blocking. Clients whose key matches wait in arrival order for a free session slot
(``max_sessions``, default 1, so measurements never overlap), then get the success reply and
their session child. A TLS session runs behind a TLS relay process (:mod:`.tls_relay`), so that
crash and timeout notices still reach the client.

Each session's child is normally a spare (:mod:`.spare`): forked and warmed up ahead, then handed
the connection. The next spare is forked when a slot is free, or as soon as a session's child
says the session is over, before it exits and is reaped, so that a client that connects again
at once finds it warm (or almost: it waits a little for it). The spares are forked by the
server's forker (:mod:`.forker`), whose answer the loop takes as it comes: the server itself
forks once.
"""
from __future__ import annotations

import collections
import logging
import selectors
import signal
import socket
import ssl
import time

from ..wire import handshake as H
from .config import ServerConfig
from .openings import Openings, Pending
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


class Server:
    def __init__(self, config: ServerConfig, listen_sock: socket.socket, registration=None) -> None:
        self.config = config
        self.listen_sock = listen_sock
        self.registration = registration
        self.selector = selectors.DefaultSelector()
        self.openings = Openings(config, self.selector, listen_sock, self._admit)
        self.waiting: collections.deque[Pending] = collections.deque()
        self.sessions: list[SessionProcess] = []
        self._watched: dict[SessionProcess, int] = {}  # session -> its registered pidfd
        self._ending: dict[SessionProcess, int | None] = {}  # session -> its status pipe until it says it ends
        self.relays: list[Relay] = []                  # TLS sessions' relay processes
        self.spares = Spares(config)
        self._spare_watched: list = []                 # the spare's pidfd, and its link until it is warm
        self._stopping = False
        self.spares.watch_forker(self.selector)
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
        self.openings.close()
        if self.registration is not None:
            self.registration.close()
        self.selector.close()

    # ------------------------------------------------------------ loop plumbing

    def _next_timeout(self) -> float:
        deadlines = [self.openings.next_deadline()]
        deadlines += [s.deadline for s in self.sessions if s.deadline is not None]
        if any(s not in self._watched for s in self.sessions):
            deadlines.append(time.monotonic() + 0.05)
        if self.registration is not None:
            deadlines.append(self.registration.next_deadline())
        if self.spares.next_fill() is not None:
            deadlines.append(self.spares.next_fill())
        if self.waiting and self._spare_warming():
            deadlines.append(self.waiting[0].admitted + WARM_UP_WAIT)
        deadlines = [d for d in deadlines if d is not None]
        if not deadlines:
            return 1.0
        return max(0.0, min(deadlines) - time.monotonic())

    def _on_tick(self) -> None:
        now = time.monotonic()
        self.openings.tick(now)
        for session in list(self.sessions):
            if session.expire_if_due(now) or (session not in self._watched and session.poll()):
                self._session_over(session)
        if self.relays:
            self.relays = [relay for relay in self.relays if not relay.reap()]
        if self.registration is not None:
            self.registration.tick()
        self._start_waiting()
        running = len(self.sessions) - sum(fd is None for fd in self._ending.values())
        if running < self.config.max_sessions and not self._stopping:
            self.spares.fill(idle=running > 0)      # a free slot, or one that its session is leaving
        self._watch_spare()

    def _watch_spare(self) -> None:
        """Watch the spare for its death and for the end of its warm-up."""
        spare = self.spares.spare
        if spare is None or spare.pid is None or self._spare_watched:
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

    def _admit(self, pending: Pending) -> None:
        """Its opening is accepted: it waits for a session if its key matches."""
        pending.admitted = time.monotonic()
        if not self._key_matches(pending.key):
            log.info("key mismatch from %s (role %r)", pending.peer, pending.key.role)
            pending.reply(H.encode_reply(H.RPC_CODE_MISMATCH))
            self.openings.drop(pending)
            return
        self.waiting.append(pending)

    def _key_matches(self, parsed: H.ParsedKey) -> bool:
        return parsed.role == "client" and parsed.matchkey == self.matchkey()

    def _start_waiting(self) -> None:
        while self.waiting and len(self.sessions) < self.config.max_sessions:
            pending = self.waiting[0]
            if pending.sock in self.openings.pending and self._spare_warming() \
                    and time.monotonic() < pending.admitted + WARM_UP_WAIT:
                return    # the spare is almost warm: worth waiting for (spare.WARM_UP_WAIT)
            self.waiting.popleft()
            if pending.sock not in self.openings.pending:
                continue  # it hung up while waiting
            if not self._key_matches(pending.key):  # the matchkey rotated while it waited
                pending.reply(H.encode_reply(H.RPC_CODE_MISMATCH))
                self.openings.drop(pending)
                continue
            self.openings.take(pending)
            success = H.encode_reply(H.RPC_CODE_SUCCESS, "server:" + self.config.key)
            self._unwatch_spare()       # its pidfd is the session's now, or closed (the tick watches a kept one)
            if isinstance(pending.sock, ssl.SSLSocket):   # the reply first: then the relay owns the stream
                if not pending.reply(success):
                    pending.sock.close()
                    continue
                session, relay = start_tls_session(pending.sock, pending.key, self.config, pending.extra,
                                                   pending.peer, start=self.spares.start)
                self.relays.append(relay)
            else:   # the child first: a spare wakes up while the reply travels and the hello comes back
                session = self.spares.start(pending.sock, pending.key, self.config, pending.extra)
                if not pending.reply(success):
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
