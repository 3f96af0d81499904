"""Sans-IO state machine for the accepting side's opening of a connection, written once for
the device server, the proxy and the tracker.

From the first byte a peer sends until it has said who it is, every service runs the same
steps (``docs/tvm-wire-formats.md`` sections 2.1 and 3, ``wire/tls.py``, ``wire/auth.py``):

1. with TLS on (:attr:`OpeningConfig.tls`), the first byte must start a TLS hello (0x16):
   a plain-TCP peer gets :data:`~kernelrpc.wire.tls.PLAINTEXT_REFUSAL` and is closed gently;
   else the driver runs the TLS handshake and reports :class:`TLSEstablished` (or
   :class:`TLSFailed`);
2. the preamble (:class:`Preamble`): TVM's RPC ``magic, len, key`` (server, proxy) or the
   tracker's 4-byte magic;
3. with an auth token, the HMAC challenge-response (:class:`~kernelrpc.wire.auth.ServiceAuth`)
   bound to the key (RPC) or to :data:`~kernelrpc.wire.auth.AUTH_CONTEXT` (tracker);
4. :class:`Accept`, with the bytes the peer sent after its opening; the tracker's magic echo is
   part of the opening, an RPC reply is the service's (it depends on the key).

Events go in through :meth:`OpeningMachine.handle` (:class:`DataReceived`,
:class:`TLSEstablished`, :class:`TLSFailed`, :class:`TimerFired`, :class:`ConnectionClosed`),
with the monotonic time; actions come out (:class:`Send`, :class:`StartTLS`,
:class:`NeedData`, :class:`Accept`, :class:`Reject`). :attr:`OpeningMachine.deadline` is when
the whole opening must be done. The machine never touches a socket or a clock, so arbitrary
bytes and events are tested without a network: they end in an :class:`Accept`, a typed
:class:`Reject` (a :class:`Refusal`), or a :class:`NeedData` within :data:`MAX_OPENING_BYTES`,
never in an exception or an unbounded buffer. The server (``server/listener.py``, selectors),
the proxy (``proxy/connection.py``, loop readers) and the tracker (``tracker/service.py``,
asyncio protocols) drive it; each logs a rejection in its own words.

Stdlib only: the device server imports it.
"""
from __future__ import annotations

import enum
from collections.abc import Callable

from ..errors import HandshakeError, ProtocolError
from .auth import AUTH_CONTEXT, MAC_BYTES, NONCE_BYTES, ServiceAuth
from .tls import PLAINTEXT_REFUSAL, is_tls_hello
from .tracker_codec import MAGIC_BYTES

MAX_KEY_BYTES = 4096
"""``wire.handshake.MAX_KEY_BYTES`` (a test checks): that module is imported for an RPC
opening only, so that the tracker's start does not pay for it."""
MAX_OPENING_BYTES = 8 + MAX_KEY_BYTES + NONCE_BYTES + MAC_BYTES
"""The most the machine ever holds of a peer's bytes (an RPC preamble, then the auth answer)."""


class _Record:
    """An immutable record with value equality, fields in ``__slots__``: what a NamedTuple
    gives, at a tenth of its cost to define (this module is on the start-up path of the
    tracker and the device server)."""

    __slots__ = ()
    _defaults: dict = {}

    def __init__(self, *args, **kwargs) -> None:
        names = self.__slots__
        if not kwargs and len(args) == len(names):      # the usual case, kept quick
            for name, value in zip(names, args):
                object.__setattr__(self, name, value)
            return
        values = {**self._defaults, **dict(zip(names, args)), **kwargs}
        if len(args) > len(names) or values.keys() != set(names):
            raise TypeError(f"{type(self).__name__} takes {', '.join(names) or 'no fields'}")
        for name in names:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name, value) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def _replace(self, **changes):
        return type(self)(**{**dict(zip(self.__slots__, self._values())), **changes})

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self.__slots__, self._values()))})"


class Preamble(enum.Enum):
    RPC = "rpc"             # TVM's ``i32 RPC_MAGIC, i32 len, key``
    TRACKER = "tracker"     # TVM's tracker magic, alone


class OpeningConfig(_Record):
    """One service's opening, fixed when the service starts: ``preamble``, ``tls`` (the
    driver has a server context: the first byte must start a TLS hello), ``auth_token``,
    ``timeout`` (seconds for the whole opening) and ``check_key``.

    ``check_key(key)`` (RPC only) vets a key before any challenge, raising
    :class:`~kernelrpc.errors.ProtocolError` or :class:`~kernelrpc.errors.HandshakeError`
    to refuse it; what it returns is :attr:`Accept.checked`.
    """

    __slots__ = ("preamble", "tls", "auth_token", "timeout", "check_key")
    _defaults = {"tls": False, "auth_token": None, "timeout": 10.0, "check_key": None}
    preamble: Preamble
    tls: bool
    auth_token: bytes | None
    timeout: float
    check_key: Callable[[str], object] | None


# -- events in --------------------------------------------------------------------------------
class DataReceived(_Record):
    __slots__ = ("data",)


class TLSEstablished(_Record):
    __slots__ = ()


class TLSFailed(_Record):
    __slots__ = ("detail",)


class TimerFired(_Record):
    __slots__ = ()


class ConnectionClosed(_Record):
    __slots__ = ()


# -- actions out -----------------------------------------------------------------------------
class Send(_Record):
    __slots__ = ("data",)


class StartTLS(_Record):
    """The bytes fed so far start a TLS hello: they are TLS's (a driver that peeked leaves them
    in the socket; one that read them hands them to its TLS layer)."""

    __slots__ = ()


class NeedData(_Record):
    """``at_most``: bytes the opening may still take; more are the session's (leftover)."""

    __slots__ = ("at_most",)


class Accept(_Record):
    """``key``: the RPC key ("" for a tracker peer); ``leftover``: what the peer sent after its
    opening; ``checked``: :attr:`OpeningConfig.check_key`'s answer."""

    __slots__ = ("key", "leftover", "checked")
    _defaults = {"checked": None}


class Refusal(enum.Enum):
    PLAINTEXT = "plain TCP to a TLS service"
    TLS_FAILED = "the TLS handshake failed"
    TLS_UNEXPECTED = "a TLS hello to a service without TLS"
    BAD_PREAMBLE = "not this service's preamble"
    BAD_KEY = "a key check_key refused"
    AUTH_FAILED = "a wrong answer to the auth challenge"
    TIMEOUT = "no opening within the time allowed"
    CLOSED = "the peer closed the connection"


class Reject(_Record):
    """Send ``reply`` (may be empty), then close; ``gently``: without a reset, so that the
    reply is not lost (see :func:`~kernelrpc.wire.tls.close_gently`). ``refusal`` says why,
    ``detail`` in words."""

    __slots__ = ("refusal", "detail", "reply", "gently")
    _defaults = {"reply": b"", "gently": False}


class State(enum.Enum):
    SNIFF = "sniff"          # TLS on: waiting for the first byte
    TLS = "tls"              # the driver runs the TLS handshake
    PREAMBLE = "preamble"
    AUTH = "auth"            # challenge sent, waiting for the answer
    OPEN = "open"            # accepted (final)
    REFUSED = "refused"      # rejected (final)


class OpeningMachine:
    """One accepted connection's opening. Feed :meth:`handle`, honour the actions in order."""

    __slots__ = ("config", "state", "deadline", "_on", "_parser", "_head", "_auth", "_key", "_checked", "_out")

    def __init__(self, config: OpeningConfig, now: float) -> None:
        self.config = config
        self._enter(State.SNIFF if config.tls else State.PREAMBLE)
        self.deadline = now + config.timeout
        self._parser = _preamble_parser() if config.preamble is Preamble.RPC else None
        self._head = b""             # a tracker peer's magic so far
        self._auth: ServiceAuth | None = None
        self._key = ""
        self._checked = None
        self._out: list = []

    @property
    def done(self) -> bool:
        return self.state is State.OPEN or self.state is State.REFUSED

    @property
    def buffered(self) -> int:
        """Peer bytes held until they complete a step (at most :data:`MAX_OPENING_BYTES`)."""
        if self.state is State.AUTH:
            return len(self._auth._buf)
        return len(self._parser._buf) if self._parser is not None else len(self._head)

    def handle(self, event, now: float) -> list:
        """Apply ``event`` at monotonic time ``now``; the actions to perform, in order."""
        self._out = out = []
        handler = self._on.get(type(event))
        if handler is not None:
            try:
                handler(self, event, now)
            except (ProtocolError, HandshakeError) as exc:
                self._reject(Refusal.BAD_PREAMBLE, str(exc))
            if type(event) is DataReceived and DataReceived in self._on:     # still reading
                out.append(NeedData(self._wants()))
        return out

    # -- transitions ------------------------------------------------------------------------
    def _sniff(self, event: DataReceived, now: float) -> None:
        if not event.data:
            return
        if is_tls_hello(event.data):
            self._enter(State.TLS)
            self._out.append(StartTLS())
        else:
            self._reject(Refusal.PLAINTEXT, f"first byte {event.data[:1].hex()}", PLAINTEXT_REFUSAL,
                         gently=True)

    def _tls_established(self, _event, now: float) -> None:
        self._enter(State.PREAMBLE)

    def _tls_failed(self, event: TLSFailed, now: float) -> None:
        self._reject(Refusal.TLS_FAILED, event.detail, gently=True)

    def _preamble(self, event: DataReceived, now: float) -> None:
        if self._parser is None:
            self._tracker_magic(event.data)
            return
        try:
            key = self._parser.feed(event.data)
        except ProtocolError as exc:
            self._refuse_preamble(bytes(self._parser._buf[:4]), str(exc))
            return
        if key is None:
            return
        check = self.config.check_key
        if check is not None:
            try:
                self._checked = check(key)
            except (ProtocolError, HandshakeError) as exc:
                self._reject(Refusal.BAD_KEY, str(exc))
                return
        self._key = key
        self._opened(key.encode(), self._parser.unused)

    def _tracker_magic(self, data: bytes) -> None:
        head = self._head + data
        if len(head) < 4:
            self._head = head
            return
        self._head = b""
        if head[:4] != MAGIC_BYTES:
            self._refuse_preamble(head[:4], f"first bytes {head[:4].hex(' ')}")
            return
        self._opened(AUTH_CONTEXT, head[4:])

    def _refuse_preamble(self, head: bytes, detail: str) -> None:
        if not self.config.tls and is_tls_hello(head):
            self._reject(Refusal.TLS_UNEXPECTED, detail)
        else:
            self._reject(Refusal.BAD_PREAMBLE, detail)

    def _opened(self, context: bytes, rest: bytes) -> None:
        """The preamble is complete: challenge the peer, or accept it."""
        token = self.config.auth_token
        if token is None:
            self._accept(rest)
            return
        self._auth = ServiceAuth(token, context)
        self._enter(State.AUTH)
        self._out.append(Send(self._auth.challenge()))
        if rest:
            self._answer(DataReceived(rest), 0.0)

    def _answer(self, event: DataReceived, now: float) -> None:
        verdict = self._auth.feed(event.data)
        if verdict is None:
            return
        if not self._auth.ok:
            self._reject(Refusal.AUTH_FAILED, "it does not know the auth token", verdict)
            return
        self._out.append(Send(verdict))
        self._accept(self._auth.unused)

    def _accept(self, leftover: bytes) -> None:
        self._enter(State.OPEN)
        if self.config.preamble is Preamble.TRACKER:
            self._out.append(Send(MAGIC_BYTES))      # the tracker's answer: its magic, echoed
        self._out.append(Accept(self._key, leftover, self._checked))

    def _timer(self, _event, now: float) -> None:
        if now >= self.deadline:
            self._reject(Refusal.TIMEOUT, f"no opening within {self.config.timeout:g} s")

    def _closed(self, _event, now: float) -> None:
        self._reject(Refusal.CLOSED, "the peer closed the connection")

    # -- helpers ----------------------------------------------------------------------------
    def _enter(self, state: State) -> None:
        self.state = state
        self._on = _TABLE[state]

    def _reject(self, refusal: Refusal, detail: str, reply: bytes = b"", gently: bool = False) -> None:
        self._enter(State.REFUSED)
        self._parser = None
        self._auth = None
        self._out.append(Reject(refusal, detail, reply, gently))

    def _wants(self) -> int:
        if self.state is State.SNIFF:
            return 1
        if self.state is State.AUTH:
            return NONCE_BYTES + MAC_BYTES - len(self._auth._buf)
        if self._parser is None:
            return 4 - len(self._head)
        return 8 + MAX_KEY_BYTES - len(self._parser._buf)


_PARSER = []


def _preamble_parser():
    """A new ``wire.handshake.PreambleParser``: that module is loaded with the first RPC
    opening, not by the tracker, which needs none of it."""
    if not _PARSER:
        from .handshake import PreambleParser
        _PARSER.append(PreambleParser)
    return _PARSER[0]()


_M = OpeningMachine
_EVERY_STEP = {TimerFired: _M._timer, ConnectionClosed: _M._closed}
_TABLE = {
    State.SNIFF: {DataReceived: _M._sniff, **_EVERY_STEP},
    State.TLS: {TLSEstablished: _M._tls_established, TLSFailed: _M._tls_failed, **_EVERY_STEP},
    State.PREAMBLE: {DataReceived: _M._preamble, **_EVERY_STEP},
    State.AUTH: {DataReceived: _M._answer, **_EVERY_STEP},
    State.OPEN: {},
    State.REFUSED: {},
}
"""state -> {event type: transition}. Events not listed are ignored (anything after the end,
bytes while the driver runs TLS)."""
