"""Sans-IO codec for the connection handshake shared with Apache TVM.

The handshake is TVM's data-plane preamble (``docs/tvm-wire-formats.md`` section 3):
the connecting side sends ``i32 RPC_MAGIC, i32 len, key`` where the key is
``"client:<matchkey> [-timeout=N]"`` (or ``"server:<key>"`` towards a proxy), and
the accepting side answers ``i32 code`` followed, on success, by
``i32 len, "server:<rpc_key>"``.  Keeping this free of sockets lets the server,
client and proxy share it and lets tests feed it arbitrary bytes.
"""
from __future__ import annotations

import dataclasses
import struct

from ..errors import HandshakeError, ProtocolError
from .auth import AUTH_CHALLENGE, refusal_for_unauthenticated
from .tracker_codec import RPC_TRACKER_MAGIC

RPC_MAGIC = 0xFF271
RPC_CODE_SUCCESS = RPC_MAGIC
RPC_CODE_DUPLICATE = 0xFF272
RPC_CODE_MISMATCH = 0xFF273

MAX_KEY_BYTES = 4096
"""Upper bound on a handshake key; TVM's keys are a few dozen bytes."""

_I32 = struct.Struct("<i")


def _describe_foreign_magic(head: bytes) -> str:
    """Say what a peer that sent the wrong magic probably is."""
    if head[:4] == _I32.pack(RPC_TRACKER_MAGIC):
        return "a tracker client (this port expects an RPC session, not the tracker protocol)"
    if head[:4] in (b"GET ", b"POST", b"HEAD", b"PUT ", b"HTTP"):
        return "an HTTP client"
    if head[:3] == b"\x16\x03\x01" or head[:3] == b"\x16\x03\x03":
        return "a TLS client"
    return f"not a kernelrpc/TVM RPC peer (first bytes {head[:4].hex(' ')})"


@dataclasses.dataclass(frozen=True)
class ParsedKey:
    """A handshake key split into role, match key and ``-name=value`` options."""

    role: str  # "client", "server" or "" when the key has no known prefix
    matchkey: str
    options: dict[str, str]

    @property
    def timeout(self) -> float | None:
        """The ``-timeout=`` option in seconds, or None when absent or zero."""
        raw = self.options.get("timeout")
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            raise HandshakeError(f"invalid -timeout option {raw!r} in handshake key") from None
        if value != value or value < 0 or value > 10 * 365 * 86400:
            raise HandshakeError(f"-timeout={raw} is out of range")
        return value or None


def make_key(role: str, matchkey: str, timeout: float | None = None) -> str:
    """Build ``"<role>:<matchkey>[ -timeout=N]"``; N is sent as an integer like TVM's C++ peers need."""
    key = f"{role}:{matchkey}"
    if timeout:
        key += f" -timeout={int(max(1, round(timeout)))}"
    return key


def parse_key(key: str) -> ParsedKey:
    """Split a handshake key the way TVM's server does: first token is the role and match key."""
    tokens = key.split()
    first = tokens[0] if tokens else key
    role, sep, matchkey = first.partition(":")
    if not sep or role not in ("client", "server"):
        role, matchkey = "", first
    options: dict[str, str] = {}
    for token in tokens[1:]:
        if token.startswith("-") and "=" in token:
            name, _, value = token[1:].partition("=")
            options[name] = value
    return ParsedKey(role, matchkey, options)


def encode_preamble(key: str) -> bytes:
    """The bytes the connecting side sends: magic, key length, key."""
    data = key.encode()
    if len(data) > MAX_KEY_BYTES:
        raise HandshakeError(f"handshake key is {len(data)} bytes, the limit is {MAX_KEY_BYTES}")
    return _I32.pack(RPC_MAGIC) + _I32.pack(len(data)) + data


def encode_reply(code: int, key: str | None = None) -> bytes:
    """The accepting side's answer: a code and, on success, ``"server:<key>"``-style text."""
    if code != RPC_CODE_SUCCESS:
        return _I32.pack(code)
    data = (key or "").encode()
    return _I32.pack(code) + _I32.pack(len(data)) + data


class _Parser:
    """Accumulates bytes until a fixed-shape message is complete; keeps what follows it."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.unused = b""
        self._done = False

    def _take(self, n: int) -> bytes | None:
        if len(self._buf) < n:
            return None
        return bytes(self._buf[:n])

    def _head(self, data, what: str) -> int | None:
        """Take ``data``; the message's leading i32 once its four bytes are here."""
        if self._done:
            raise ProtocolError(f"{what} already parsed")
        self._buf += data
        head = self._take(4)
        return None if head is None else _I32.unpack(head)[0]

    def _text(self, what: str) -> bytes | None:
        """The length-prefixed bytes after the leading i32 once they are all here (the message
        is then finished); the length is checked against MAX_KEY_BYTES first."""
        raw_len = self._take(8)
        if raw_len is None:
            return None
        n = _I32.unpack(raw_len[4:])[0]
        if n < 0 or n > MAX_KEY_BYTES:
            raise ProtocolError(f"{what} length {n} is outside [0, {MAX_KEY_BYTES}]")
        raw = self._take(8 + n)
        if raw is None:
            return None
        self._finish(8 + n)
        return raw[8:]

    def _finish(self, consumed: int):
        self.unused = bytes(self._buf[consumed:])
        self._buf.clear()
        self._done = True


class PreambleParser(_Parser):
    """Parses ``magic, len, key``. ``feed`` returns the key text once complete, else None."""

    def feed(self, data: bytes) -> str | None:
        magic = self._head(data, "preamble")
        if magic is None:
            return None
        if magic != RPC_MAGIC:
            raise ProtocolError(f"bad handshake magic: peer is {_describe_foreign_magic(bytes(self._buf))}")
        raw = self._text("handshake key")
        if raw is None:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise ProtocolError("handshake key is not valid UTF-8") from None


@dataclasses.dataclass(frozen=True)
class Reply:
    code: int
    key: str = ""

    @property
    def ok(self) -> bool:
        return self.code == RPC_CODE_SUCCESS

    def raise_for_code(self, where: str = "peer") -> None:
        """Raise a HandshakeError that says what the code means for the user."""
        if self.code == RPC_CODE_SUCCESS:
            return
        if self.code == RPC_CODE_MISMATCH:
            raise HandshakeError(
                f"{where} has no session for this key (MISMATCH): the key is stale or was taken, "
                "or no device with that key is connected")
        if self.code == RPC_CODE_DUPLICATE:
            raise HandshakeError(f"{where} already has a peer waiting with this key (DUPLICATE)")
        raise HandshakeError(f"{where} answered code {self.code:#x}: it is not an RPC server")


class ReplyParser(_Parser):
    """Parses the accepting side's answer; ``feed`` returns a :class:`Reply` once complete."""

    def feed(self, data: bytes) -> Reply | None:
        code = self._head(data, "reply")
        if code is None:
            return None
        if code == AUTH_CHALLENGE:
            raise refusal_for_unauthenticated("the server")
        if code != RPC_CODE_SUCCESS:
            if code not in (RPC_CODE_MISMATCH, RPC_CODE_DUPLICATE):
                raise ProtocolError(f"bad handshake reply: peer is {_describe_foreign_magic(bytes(self._buf))}")
            self._finish(4)
            return Reply(code)
        raw = self._text("handshake reply key")
        return None if raw is None else Reply(code, raw.decode(errors="replace"))
