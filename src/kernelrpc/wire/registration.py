"""Sans-IO state machine that keeps offers registered at a tracker: one device server's, or
every device waiting at a proxy.

Events go in (:class:`Connected`, :class:`DataReceived`, :class:`TimerFired`,
:class:`ConnectionClosed`, and what changes the offers: :class:`SessionStarted`,
:class:`SessionFinished` for a server, :class:`OfferAdded`, :class:`OfferWithdrawn` for a
proxy); actions come out (:class:`Connect`, :class:`Send`, :class:`Disconnect`), and
:attr:`RegistrationMachine.deadline` says when the driver must deliver the next
:class:`TimerFired`.  The machine never touches a socket or a clock, so it is tested and
fuzzed without a network; peer bytes that make no sense become a :class:`Disconnect`, never
an exception.  A server (``server/registration.py``, selectors) and the proxy
(``proxy/tracker_link.py``, asyncio) drive it.

The sequence follows TVM's ``rpc_server --tracker`` and ``rpc_proxy --tracker``
(``docs/tvm-wire-formats.md`` sections 2.6 and 4.4):

1. connect, send the magic alone (after the HMAC challenge-response when a token is set) and
   wait for its echo;
2. UPDATE_INFO (what this registration is, see :meth:`RegistrationMachine._info`) whenever
   it changes, then one PUT ``[KEY, [port, matchkey], custom_addr]`` per offer;
3. every ``poll_interval`` GET_PENDING_MATCHKEYS;
4. any failure disconnects and reconnects after a jittered exponential backoff
   (:class:`~kernelrpc.wire.backoff.Backoff`), so registrations come back by themselves after
   a tracker restart.

Each offer (:class:`Offer`) is in one :class:`OfferState`.  One match-key rule for server
and proxy: a key is replaced when it was used (the offer ends), when the tracker handed it
out and no client came within ``MISSES_BEFORE_ROTATE`` polls, and on every new connection
(the tracker forgot our slots with the old one).

Stdlib only: the device server imports it.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import logging
import secrets
from collections.abc import Callable, Hashable
from typing import ClassVar

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
MAX_PENDING_KEYS = 100_000
"""Bound on a GET_PENDING_MATCHKEYS answer (the tracker's frame limit bounds it anyway)."""
DEVICE_INFO_BUDGET = 12 * 1024
"""JSON bytes a proxy's ``"device"`` and ``"devices"`` may take in its UPDATE_INFO: kernelrpc's
tracker holds at most 16 KiB of info per connection and refuses the update beyond that."""


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
class ConnectionClosed:
    reason: str = "the tracker closed the connection"


@dataclasses.dataclass(frozen=True)
class SessionStarted:
    """A server's session began: its offer ends (``"session": "active"``)."""


@dataclasses.dataclass(frozen=True)
class SessionFinished:
    """A server's session ended: it is offered again under a fresh key."""


@dataclasses.dataclass(frozen=True)
class OfferAdded:
    """A proxy's device waits: offer it as ``key`` (its RPC key) under ``matchkey``; ``device``
    is its checked device record, if it sent one."""
    offer: Hashable
    key: str
    matchkey: str
    protocol: str = ""
    device: dict | None = dataclasses.field(default=None, hash=False)


@dataclasses.dataclass(frozen=True)
class OfferWithdrawn:
    """A proxy's device stopped waiting.  ``handed_out``: a client came with its match key, so
    the tracker no longer holds that slot."""
    offer: Hashable
    handed_out: bool = False


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


class OfferState(enum.Enum):
    WAITING = "waiting"     # not at the tracker (yet): PUT as soon as the link is ready
    OFFERED = "offered"     # PUT on this connection; the tracker holds the slot
    CLAIMED = "claimed"     # the tracker handed the key to a client, which has not come (yet)


@dataclasses.dataclass
class Offer:
    """One slot at the tracker; written by the machine only."""
    key: str
    matchkey: str
    protocol: str
    state: OfferState = OfferState.WAITING
    misses: int = 0         # polls in a row in which the tracker no longer held the key
    device: str = ""        # a proxy's device: its record as canonical JSON ("" without one)


class _Failure(Exception):
    pass


def random_matchkey(key: str) -> str:
    """``<key>:<64 random bits>``: never one used before, for all practical purposes."""
    return f"{key}:{secrets.token_hex(8)}"


class RegistrationMachine:
    """What server and proxy registrations share: the connection, the polls, the offers.

    Feed it with :meth:`handle` and honour the actions it returns.  Subclasses say what the
    registration is (:meth:`_info`), how an offer gets a fresh match key (:meth:`_rekey`),
    and which events change their offers (``_OFFER_EVENTS``: they apply in every state but
    CLOSED, and shape what the link offers next).
    """

    _OFFER_EVENTS: ClassVar[dict] = {}

    def __init__(self, port: int, custom_addr: str | None = None, *, where: str = "tracker",
                 poll_interval: float = 2.0, auth_token: bytes | None = None,
                 backoff: Backoff | None = None, now: float = 0.0, logger: logging.Logger = log) -> None:
        self.log = logger
        self.port = int(port)
        self.custom_addr = custom_addr
        self.where = where
        self.poll_interval = poll_interval
        self.state = State.DISCONNECTED
        self.registered = False
        self.offers: dict[Hashable, Offer] = {}
        self.deadline = self._retry_at = now
        self._state_deadline = self._waiting_since = now
        self._auth_token = auth_token
        self._auth: PeerAuth | None = None
        self._backoff = backoff or Backoff()
        self._decoder = FrameDecoder()
        self._echo = b""
        self._expect: list[str] = []      # what each outstanding reply answers, in order
        self._reported: dict | None = None  # the UPDATE_INFO fields sent on this connection
        self._next_poll = 0.0
        self._failures = 0
        self._last_warning = -1e9
        self._local_host = ""
        self._out: list = []

    def offer_state(self, offer: Hashable) -> OfferState | None:
        """Where ``offer`` stands; None once it has ended (or was never added)."""
        entry = self.offers.get(offer)
        return None if entry is None else entry.state

    # -- the one entry point ----------------------------------------------------------------
    def handle(self, event, now: float) -> list:
        """Apply ``event`` at monotonic time ``now``; returns the actions to perform, in order."""
        self._out = []
        if self.state is not State.CLOSED:
            handler = _TABLE.get((self.state, type(event))) or self._OFFER_EVENTS.get(type(event))
            if handler is not None:
                try:
                    handler(self, event, now)
                    if self.state is State.READY:
                        self._sync(now)
                except (_Failure, ProtocolError, AuthenticationError) as exc:
                    self._fail(str(exc) or type(exc).__name__, now)
        self._update_deadline()
        return self._out

    def close(self) -> None:
        self.state = State.CLOSED
        self.registered = False
        self.deadline = float("inf")

    # -- what subclasses decide -------------------------------------------------------------
    def _info(self, first: bool) -> dict:
        """The UPDATE_INFO fields that describe this registration (``first``: on a new connection)."""
        raise NotImplementedError

    def _rekey(self, offer: Hashable, entry: Offer) -> str:
        """A fresh match key for ``offer``."""
        return random_matchkey(entry.key)

    def _registered(self) -> None:
        self.log.info("registered at tracker %s", self.where)

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
        self._reported = None
        for offer, entry in self.offers.items():     # the tracker forgot the slots of the last link
            self._replace_key(offer, entry)
        self._sync(now)
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

    # -- offers -----------------------------------------------------------------------------
    def _sync(self, now: float) -> None:
        """On a ready link: report what changed, and PUT every offer not at the tracker."""
        self._report({}, now)
        for entry in self.offers.values():
            if entry.state is OfferState.WAITING:
                self._report({"protocol": entry.protocol}, now)
                self._send([TrackerCode.PUT, entry.key, [self.port, entry.matchkey], self.custom_addr], "put", now)
                entry.state = OfferState.OFFERED
                entry.misses = 0
                self.log.info("offered %s to the tracker", entry.matchkey)

    def _report(self, extra: dict, now: float) -> None:
        """UPDATE_INFO when a field differs from what the tracker has (it merges updates)."""
        first = self._reported is None
        info = {**self._info(first), **extra}
        reported = self._reported or {}
        if first or any(reported.get(k, _UNSET) != v for k, v in info.items()):
            self._send([TrackerCode.UPDATE_INFO, info], "info", now)
            self._reported = {**reported, **info}

    def _replace_key(self, offer: Hashable, entry: Offer) -> str:
        old = entry.matchkey
        entry.matchkey = self._rekey(offer, entry)
        entry.state = OfferState.WAITING
        entry.misses = 0
        return old

    def _after_poll(self, pending: set, now: float) -> None:
        for offer, entry in list(self.offers.items()):
            if entry.state is OfferState.WAITING:
                continue
            if entry.matchkey in pending:
                entry.state, entry.misses = OfferState.OFFERED, 0
                continue
            if entry.state is OfferState.OFFERED:
                entry.state = OfferState.CLAIMED
                self.log.info("the tracker handed out %s; waiting for its client", entry.matchkey)
            entry.misses += 1
            if entry.misses >= MISSES_BEFORE_ROTATE:
                old = self._replace_key(offer, entry)
                self.log.info("no client came for %s; offering it as %s", old, entry.matchkey)

    # -- helpers ----------------------------------------------------------------------------
    def _fail(self, reason: str, now: float) -> None:
        was_registered = self.registered
        connected = self.state is not State.DISCONNECTED
        self._drop_link()
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

    def _reconnect_now(self, reason: str, now: float) -> None:
        """Drop a working link on purpose (no failure, no backoff) and open a new one at once."""
        self.log.info("%s; re-registering with tracker %s", reason, self.where)
        self._drop_link()
        self._retry_at = now
        self._out = [a for a in self._out if not isinstance(a, Send)] + [Disconnect(reason, 0.0)]

    def _drop_link(self) -> None:
        self.state = State.DISCONNECTED
        self.registered = False
        self._expect = []
        self._auth = None
        for entry in self.offers.values():
            if entry.state is OfferState.OFFERED:
                entry.state = OfferState.WAITING

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

    def _send(self, msg, expect: str, now: float) -> None:
        self._out.append(Send(encode_frame(msg)))
        if not self._expect:
            self._waiting_since = now
        self._expect.append(expect)

    def _handle_reply(self, what: str, reply, now: float) -> None:
        if what == "pending":
            if not isinstance(reply, list) or len(reply) > MAX_PENDING_KEYS \
                    or not all(isinstance(k, str) for k in reply):
                raise ProtocolError(f"GET_PENDING_MATCHKEYS answered {reply!r:.100}, not a list of keys")
            self._next_poll = now + self.poll_interval
            self._after_poll(set(reply), now)
            return
        if reply != TrackerCode.SUCCESS:
            raise ProtocolError(f"the tracker refused {what.upper()}: {reply!r:.200}")
        if not self.registered and not self._expect:
            self.registered = True
            self._backoff.reset()
            self._failures = 0
            self._next_poll = now + self.poll_interval
            self._registered()


_UNSET = object()


class Registration(RegistrationMachine):
    """One device server under ``key``: one offer while no session runs.

    UPDATE_INFO ``{"key": "server:<key>", "addr": [custom_addr, port], "session": "idle" or
    "active", "protocol": ..., "device": ...}``; a session start ends the offer, its end offers
    the server again under a fresh key.
    """

    def __init__(self, key: str, port: int, custom_addr: str | None = None, *,
                 device: dict | None = None, **kwargs) -> None:
        super().__init__(port, custom_addr, **kwargs)
        self.key = key
        self.device = device or {}
        self._busy = False
        self._offer = Offer(key, random_matchkey(key), VERSION_STRING)
        self.offers[key] = self._offer

    @property
    def matchkey(self) -> str:
        """The key a client of this server must present (the offered one, or the next one)."""
        return self._offer.matchkey

    def _info(self, first: bool) -> dict:
        info = {"key": "server:" + self.key, "addr": [self.custom_addr, self.port],
                "session": "active" if self._busy else "idle", "protocol": VERSION_STRING}
        if first:        # once per connection: trackers merge later updates into it
            info["device"] = self.device
        return info

    def _registered(self) -> None:
        self.log.info("registered key %s at tracker %s, advertised %s:%d", self.key, self.where,
                      self.custom_addr or self._local_host, self.port)

    def _session_started(self, _event, now: float) -> None:
        self._busy = True
        self.offers.pop(self.key, None)
        self._replace_key(self.key, self._offer)

    def _session_finished(self, _event, now: float) -> None:
        self._busy = False
        self._replace_key(self.key, self._offer)
        self.offers[self.key] = self._offer

    _OFFER_EVENTS: ClassVar[dict] = {SessionStarted: _session_started, SessionFinished: _session_finished}


class ProxyRegistration(RegistrationMachine):
    """Every device waiting at a proxy, one offer each.

    UPDATE_INFO ``{"key": "server:proxy[K1,K2]", "addr": [custom_addr, port]}`` names the
    waiting keys, with ``"protocol"`` set to the next offer's before its PUT, and the waiting
    devices' records once any device sent one (:meth:`_device_fields`).  The tracker has
    no message to withdraw a slot: when a device stops waiting while the tracker still holds
    its slot, the machine reconnects, which drops all our slots, and offers the others again.

    ``rekey(offer)`` gives ``offer`` a fresh match key (the proxy's pairing owns the keys).
    """

    def __init__(self, port: int, custom_addr: str | None = None, *,
                 rekey: Callable[[Hashable], str], **kwargs) -> None:
        super().__init__(port, custom_addr, **kwargs)
        self._rekey_offer = rekey
        self._devices: dict | None = None     # _device_fields(), until the offers change
        self._omitted = 0

    def _info(self, first: bool) -> dict:
        keys = sorted({entry.key for entry in self.offers.values()})
        info = {"key": "server:proxy[" + ",".join(keys) + "]", "addr": [self.custom_addr, self.port]}
        reported = self._reported or {}     # once a field is sent, always: the tracker merges updates
        fields = self._device_fields()
        if fields["device"] or fields["devices"] or "devices" in reported:
            info["device"], info["devices"] = fields["device"], fields["devices"]
        if fields["devices_omitted"] or "devices_omitted" in reported:
            info["devices_omitted"] = fields["devices_omitted"]
        return info

    def _device_fields(self) -> dict:
        """What the tracker is told about the waiting devices' records.

        ``"device"``: the record, when every waiting device sent the same one (one device, or a
        shelf of identical boards), so it reads exactly like a direct server's; else ``{}``.
        ``"devices"``: per RPC key, each distinct record once, in arrival order (the tracker
        hands out any device of a key, so which record goes with which slot is not told).
        ``"devices_omitted"``: how many distinct records did not fit in
        :data:`DEVICE_INFO_BUDGET` and were left out.
        """
        if self._devices is not None:
            return self._devices
        texts = {entry.device for entry in self.offers.values()}
        common = texts.pop() if len(texts) == 1 else ""
        size = len(common)
        devices: dict[str, list] = {}
        seen: set = set()
        omitted = 0
        for entry in self.offers.values():
            if not entry.device or (entry.key, entry.device) in seen:
                continue
            seen.add((entry.key, entry.device))
            size += len(entry.device) + len(entry.key) + 8
            if size > DEVICE_INFO_BUDGET:
                omitted += 1
                continue
            devices.setdefault(entry.key, []).append(json.loads(entry.device))
        self._devices = {"device": json.loads(common) if common else {},
                         "devices": dict(sorted(devices.items())), "devices_omitted": omitted}
        if omitted > self._omitted:
            self.log.warning("%d device records left out of the tracker registration: more than %d "
                             "bytes of them", omitted, DEVICE_INFO_BUDGET)
        self._omitted = omitted
        return self._devices

    def _rekey(self, offer: Hashable, entry: Offer) -> str:
        return self._rekey_offer(offer)

    def _registered(self) -> None:
        self.log.info("registered with tracker %s (%d devices offered)", self.where, len(self.offers))

    def _offer_added(self, event: OfferAdded, now: float) -> None:
        device = json.dumps(event.device, sort_keys=True) if event.device else ""
        self.offers[event.offer] = Offer(event.key, event.matchkey, event.protocol, device=device)
        self._devices = None

    def _offer_withdrawn(self, event: OfferWithdrawn, now: float) -> None:
        entry = self.offers.pop(event.offer, None)
        self._devices = None
        if entry is not None and entry.state is OfferState.OFFERED and not event.handed_out \
                and self.state is State.READY:
            self._reconnect_now(f"withdrawing slots ({entry.matchkey} stopped waiting)", now)

    _OFFER_EVENTS: ClassVar[dict] = {OfferAdded: _offer_added, OfferWithdrawn: _offer_withdrawn}


_R = RegistrationMachine
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
