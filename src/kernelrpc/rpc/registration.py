"""Sans-IO state machine that keeps one device server registered at a tracker.

Events go in (:class:`Connected`, :class:`DataReceived`, :class:`TimerFired`,
:class:`SessionStarted`, :class:`SessionFinished`, :class:`ConnectionClosed`); actions come
out (:class:`Connect`, :class:`Send`, :class:`Disconnect`), and :attr:`Registration.deadline`
says when the driver must deliver the next :class:`TimerFired`.  The machine never touches a
socket or a clock, so it is tested and fuzzed without a network; peer bytes that make no sense
become a :class:`Disconnect`, never an exception.

The sequence follows TVM's ``rpc_server --tracker`` (``docs/tvm-wire-formats.md`` section 2.6):

1. connect, send the magic alone (after the HMAC challenge-response when a token is set) and
   wait for its echo;
2. UPDATE_INFO ``{"key": "server:<key>", "addr": [custom_addr, port], "session": ...,
   "protocol": ..., "device": ...}`` then PUT ``[3, key, [port, matchkey], custom_addr]``;
3. every ``poll_interval`` GET_PENDING_MATCHKEYS; when the current match key has been missing
   for ``MISSES_BEFORE_ROTATE`` polls (a client took it and never came), offer a fresh one;
4. a session start retires the match key (UPDATE_INFO ``"session": "active"``); its end
   offers a fresh one (``"idle"`` and a new PUT);
5. any failure disconnects and reconnects after a jittered exponential backoff, so servers
   come back by themselves after a tracker restart.

Stdlib only: the device server imports it.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import secrets

from ..errors import AuthenticationError, ProtocolError
from .auth import AUTH_CONTEXT, CHALLENGE_HEAD, PeerAuth, refusal_for_unauthenticated
from .backoff import Backoff
from .protocol import VERSION_STRING
from .tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode, check_magic, encode_frame

log = logging.getLogger(__name__)

MISSES_BEFORE_ROTATE = 4
"""TVM's rule: ``misses * 2 > 4 + 2`` with a 2 s poll, i.e. four polls in a row."""

CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 10.0


# -- events in --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Connected:
    local_host: str = ""          # the address the tracker sees us at, for the log line


@dataclasses.dataclass(frozen=True)
class DataReceived:
    data: bytes


@dataclasses.dataclass(frozen=True)
class TimerFired:
    pass


@dataclasses.dataclass(frozen=True)
class SessionStarted:
    pass


@dataclasses.dataclass(frozen=True)
class SessionFinished:
    pass


@dataclasses.dataclass(frozen=True)
class ConnectionClosed:
    reason: str = "the tracker closed the connection"


# -- actions out ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Connect:
    pass


@dataclasses.dataclass(frozen=True)
class Send:
    data: bytes


@dataclasses.dataclass(frozen=True)
class Disconnect:
    reason: str
    retry_in: float


class State(enum.Enum):
    DISCONNECTED = "disconnected"     # waiting for the backoff timer
    CONNECTING = "connecting"         # Connect issued, waiting for Connected
    OPENING = "opening"               # magic sent: authenticating, then waiting for the echo
    READY = "ready"                   # registered (or registering): requests and replies
    CLOSED = "closed"


class _Failure(Exception):
    pass


class Registration:
    """The state machine; feed it with :meth:`handle` and honour the actions it returns."""

    def __init__(self, key: str, port: int, custom_addr: str | None = None, *, where: str = "tracker",
                 poll_interval: float = 2.0, auth_token: bytes | None = None, device: dict | None = None,
                 backoff: Backoff | None = None, now: float = 0.0, logger: logging.Logger = log) -> None:
        self.log = logger
        self.key = key
        self.port = int(port)
        self.custom_addr = custom_addr
        self.where = where
        self.poll_interval = poll_interval
        self.device = device or {}
        self.state = State.DISCONNECTED
        self.matchkey: str | None = None
        self.registered = False
        self.deadline = self._retry_at = now
        self._state_deadline = self._waiting_since = now
        self._auth_token = auth_token
        self._auth: PeerAuth | None = None
        self._backoff = backoff or Backoff(0.25, 10.0)
        self._decoder = FrameDecoder()
        self._echo = b""
        self._expect: list[str] = []      # what each outstanding reply answers, in order
        self._next_poll = 0.0
        self._misses = 0
        self._busy = False
        self._failures = 0
        self._last_warning = -1e9
        self._local_host = ""
        self._out: list = []

    # -- the one entry point ----------------------------------------------------------------
    def handle(self, event, now: float) -> list:
        """Apply ``event`` at monotonic time ``now``; returns the actions to perform, in order."""
        self._out = []
        handler = _TABLE.get((self.state, type(event)))
        if handler is None and self.state is not State.CLOSED and isinstance(event, (SessionStarted, SessionFinished)):
            handler = _SESSION[type(event)]
        if handler is not None:
            try:
                handler(self, event, now)
            except (_Failure, ProtocolError, AuthenticationError) as exc:
                self._fail(str(exc) or type(exc).__name__, now)
        self._update_deadline()
        return self._out

    def close(self) -> None:
        self.state = State.CLOSED
        self.registered = False
        self.deadline = float("inf")

    # -- transitions ------------------------------------------------------------------------
    def _start_connect(self, _event, now: float) -> None:
        if now < self._retry_at:
            return
        self.state = State.CONNECTING
        self._state_deadline = now + CONNECT_TIMEOUT
        self._out.append(Connect())

    def _connect_timed_out(self, _event, now: float) -> None:
        if now >= self._state_deadline:
            raise _Failure(f"connection timed out after {CONNECT_TIMEOUT:g} s")

    def _connected(self, event: Connected, now: float) -> None:
        self._local_host = event.local_host
        self.state = State.OPENING
        self._echo = b""
        self._auth = (PeerAuth(self._auth_token, AUTH_CONTEXT, f"tracker {self.where}")
                      if self._auth_token is not None else None)
        self._state_deadline = now + REPLY_TIMEOUT
        self._out.append(Send(MAGIC_BYTES))      # alone: TVM's tracker wants it in its own segment

    def _opening_timed_out(self, _event, now: float) -> None:
        if now >= self._state_deadline:
            raise _Failure("the tracker did not answer the magic")

    def _opening_data(self, event: DataReceived, now: float) -> None:
        data = event.data
        if self._auth is not None and not self._auth.done:
            step = self._auth.feed(data)
            if isinstance(step, bytes):
                self._out.append(Send(step))
            if step is not True:
                return
            data = self._auth.unused
        elif (self._echo + data)[:4] == CHALLENGE_HEAD:
            raise refusal_for_unauthenticated(f"tracker {self.where}")
        self._echo += data
        if len(self._echo) < 4:
            return
        try:
            check_magic(self._echo[:4])
        except ProtocolError as exc:
            raise ProtocolError(f"{self.where} is not a tracker: {exc}") from None
        self.state = State.READY
        self._decoder = FrameDecoder()
        self._expect = []
        self.matchkey = self._fresh_matchkey()
        self._send([TrackerCode.UPDATE_INFO, self._info("active" if self._busy else "idle", with_device=True)],
                   "info", now)
        if not self._busy:
            self._offer(now)
        if self._echo[4:]:
            self._ready_data(DataReceived(self._echo[4:]), now)

    def _ready_timer(self, _event, now: float) -> None:
        if self._expect:
            if now - self._waiting_since >= REPLY_TIMEOUT:
                raise _Failure(f"no reply from the tracker in {REPLY_TIMEOUT:g} s")
        elif now >= self._next_poll:
            self._send([TrackerCode.GET_PENDING_MATCHKEYS], "pending", now)

    def _ready_data(self, event: DataReceived, now: float) -> None:
        for reply in self._decoder.feed(event.data):
            if not self._expect:
                raise ProtocolError(f"unexpected message from the tracker: {reply!r:.100}")
            self._handle_reply(self._expect.pop(0), reply, now)
            self._waiting_since = now

    def _closed_by_peer(self, event: ConnectionClosed, now: float) -> None:
        raise _Failure(event.reason)

    def _session_started(self, _event, now: float) -> None:
        self._busy = True
        self._misses = 0
        self.matchkey = self._fresh_matchkey()
        if self.state is State.READY:
            self._send([TrackerCode.UPDATE_INFO, self._info("active")], "info", now)

    def _session_finished(self, _event, now: float) -> None:
        self._busy = False
        self._misses = 0
        self.matchkey = self._fresh_matchkey()
        if self.state is State.READY:
            self._send([TrackerCode.UPDATE_INFO, self._info("idle")], "info", now)
            self._offer(now)

    # -- helpers ----------------------------------------------------------------------------
    def _fail(self, reason: str, now: float) -> None:
        was_registered = self.registered
        connected = self.state is not State.DISCONNECTED
        self.state = State.DISCONNECTED
        self.registered = False
        self._expect = []
        self._auth = None
        delay = self._backoff.next()
        self._retry_at = now + delay
        self._failures += 1
        if connected:
            self._out = [a for a in self._out if not isinstance(a, Send)] + [Disconnect(reason, delay)]
        if was_registered:
            self.log.warning("lost the connection to tracker %s (%s); reconnecting in %.1f s", self.where, reason, delay)
        elif self._failures == 1 or now - self._last_warning >= 30:
            self.log.warning("cannot reach tracker %s (%s); retrying in %.1f s", self.where, reason, delay)
            self._last_warning = now
        else:
            self.log.debug("cannot reach tracker %s (%s); retrying in %.1f s", self.where, reason, delay)

    def _update_deadline(self) -> None:
        if self.state is State.CLOSED:
            self.deadline = float("inf")
        elif self.state is State.DISCONNECTED:
            self.deadline = self._retry_at
        elif self.state is not State.READY:
            self.deadline = self._state_deadline
        elif self._expect:
            self.deadline = self._waiting_since + REPLY_TIMEOUT
        else:
            self.deadline = self._next_poll

    def _info(self, session: str, *, with_device: bool = False) -> dict:
        info = {"key": "server:" + self.key, "addr": [self.custom_addr, self.port], "session": session,
                "protocol": VERSION_STRING}
        if with_device:        # once per connection: trackers merge later updates into it
            info["device"] = self.device
        return info

    def _offer(self, now: float) -> None:
        self._send([TrackerCode.PUT, self.key, [self.port, self.matchkey], self.custom_addr], "put", now)

    def _send(self, msg, expect: str, now: float) -> None:
        self._out.append(Send(encode_frame(msg)))
        if not self._expect:
            self._waiting_since = now
        self._expect.append(expect)

    def _handle_reply(self, what: str, reply, now: float) -> None:
        if what == "pending":
            if not isinstance(reply, list):
                raise ProtocolError(f"GET_PENDING_MATCHKEYS answered {reply!r:.100}")
            self._next_poll = now + self.poll_interval
            self._after_poll(reply, now)
            return
        if reply != TrackerCode.SUCCESS:
            raise ProtocolError(f"the tracker refused {what.upper()}: {reply!r:.200}")
        if not self.registered and not self._expect:
            self.registered = True
            self._backoff.reset()
            self._failures = 0
            self._next_poll = now + self.poll_interval
            self.log.info("registered key %s at tracker %s, advertised %s:%d", self.key, self.where,
                     self.custom_addr or self._local_host, self.port)

    def _after_poll(self, pending: list, now: float) -> None:
        if self._busy or self.matchkey in pending:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= MISSES_BEFORE_ROTATE:
            self.log.info("match key for %s was taken but no client came; offering a fresh one", self.key)
            self._misses = 0
            self.matchkey = self._fresh_matchkey()
            self._offer(now)

    def _fresh_matchkey(self) -> str:
        """``<key>:<64 random bits>``: never one used before, for all practical purposes."""
        return f"{self.key}:{secrets.token_hex(8)}"


_R = Registration
_TABLE = {
    (State.DISCONNECTED, TimerFired): _R._start_connect,
    (State.CONNECTING, TimerFired): _R._connect_timed_out,
    (State.CONNECTING, Connected): _R._connected,
    (State.CONNECTING, ConnectionClosed): _R._closed_by_peer,
    (State.OPENING, TimerFired): _R._opening_timed_out,
    (State.OPENING, DataReceived): _R._opening_data,
    (State.OPENING, ConnectionClosed): _R._closed_by_peer,
    (State.READY, TimerFired): _R._ready_timer,
    (State.READY, DataReceived): _R._ready_data,
    (State.READY, ConnectionClosed): _R._closed_by_peer,
}
"""(state, event) -> transition.  Pairs not listed are ignored (e.g. late bytes after a failure)."""

_SESSION = {SessionStarted: _R._session_started, SessionFinished: _R._session_finished}
"""Session events apply in every state except CLOSED: they change what the next connection offers."""
