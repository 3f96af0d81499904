"""Validation of decoded tracker messages into typed commands (sans-IO).

Accepts what TVM's peers send (``docs/tvm-wire-formats.md`` section 2.3), including the
3-element PUT and the C++ server's port-as-string, and bounds every field.

kernelrpc's peers name their session protocol in fields TVM already carries and
ignores: a server in its UPDATE_INFO dict (``"protocol": "kernelrpc/1"``, applying to
the slots it PUTs after it), a client in REQUEST's ``user``.  TVM's send neither.
"""
from __future__ import annotations

import dataclasses
import json

from ..errors import ProtocolError
from ..wire.tracker_codec import MAX_PROTOCOL_CHARS, TrackerCode

MAX_KEY_CHARS = 256
MAX_MATCHKEY_CHARS = 1024
MAX_ADDR_CHARS = 255
MAX_INFO_BYTES = 16 * 1024
MAX_PRIORITY = 1 << 31


@dataclasses.dataclass(slots=True)
class Put:
    key: str
    port: object
    matchkey: str
    custom_addr: str | None


@dataclasses.dataclass(slots=True)
class Request:
    key: str
    user: str
    """The client's session protocol ("" from TVM's clients, which send nothing there)."""
    priority: int


UNREACHABLE = "unreachable"
"""UPDATE_INFO field a client sends when it cannot reach the server it was handed:
``{"key": KEY, "addr": [host, port], "matchkey": MATCHKEY}``.  TVM's tracker merges it
into the client's info and ignores it; ours holds that server's slots back."""


@dataclasses.dataclass(slots=True)
class Unreachable:
    key: str
    host: str
    port: object
    matchkey: str


@dataclasses.dataclass(slots=True)
class UpdateInfo:
    info: dict
    unreachable: Unreachable | None = None


@dataclasses.dataclass(slots=True)
class Simple:
    code: TrackerCode


@dataclasses.dataclass(slots=True)
class Stop:
    stop_key: object


def _text(value, what: str, limit: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit or (not value and not allow_empty):
        raise ProtocolError(f"{what} must have 1 to {limit} characters, got {len(value)}")
    return value


def _port(value, what: str = "port"):
    """An int in [0, 65535], or a numeric string (TVM's C++ server); returned unchanged."""
    number = value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= 65535:
        raise ProtocolError(f"{what} must be an integer in [0, 65535], got {value!r}")
    return value


def _parse_put(msg: list) -> Put:
    # Fast path: the shape every server sends, checked with exact types (JSON decodes to
    # plain str/int/list); anything else takes the general checks below, which explain.
    if len(msg) == 4:
        key, slot, custom = msg[1], msg[2], msg[3]
        if (type(key) is str and 0 < len(key) <= MAX_KEY_CHARS and type(slot) is list and len(slot) == 2
                and type(slot[0]) is int and 0 <= slot[0] <= 65535
                and type(slot[1]) is str and 0 < len(slot[1]) <= MAX_MATCHKEY_CHARS
                and (custom is None or (type(custom) is str and 0 < len(custom) <= MAX_ADDR_CHARS))):
            return Put(key, slot[0], slot[1], custom)
    if len(msg) not in (3, 4):
        raise ProtocolError("PUT is [3, key, [port, matchkey], custom_addr]")
    slot = msg[2]
    if not isinstance(slot, list) or len(slot) != 2:
        raise ProtocolError("PUT's third element must be [port, matchkey]")
    custom = msg[3] if len(msg) == 4 else None
    if custom is not None:
        custom = _text(custom, "custom address", MAX_ADDR_CHARS)
    return Put(_text(msg[1], "key", MAX_KEY_CHARS), _port(slot[0]),
               _text(slot[1], "match key", MAX_MATCHKEY_CHARS), custom)


def _parse_request(msg: list) -> Request:
    if len(msg) == 4:           # fast path, as in _parse_put
        key, user, priority = msg[1], msg[2], msg[3]
        if (type(key) is str and 0 < len(key) <= MAX_KEY_CHARS and type(user) is str and len(user) <= MAX_KEY_CHARS
                and type(priority) is int and -MAX_PRIORITY <= priority <= MAX_PRIORITY):
            return Request(key, user, priority)
    if len(msg) != 4:
        raise ProtocolError("REQUEST is [4, key, user, priority]")
    priority = msg[3]
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise ProtocolError(f"priority must be an integer with |priority| <= 2**31, got {priority!r}")
    user = msg[2] if msg[2] is not None else ""
    return Request(_text(msg[1], "key", MAX_KEY_CHARS), _text(user, "user", MAX_KEY_CHARS, allow_empty=True),
                   priority)


def _parse_update_info(msg: list) -> UpdateInfo:
    if len(msg) != 2 or not isinstance(msg[1], dict):
        raise ProtocolError("UPDATE_INFO is [5, {...}]")
    info = msg[1]
    if len(json.dumps(info)) > MAX_INFO_BYTES:
        raise ProtocolError(f"UPDATE_INFO dict is larger than {MAX_INFO_BYTES} bytes")
    addr = info.get("addr")
    if not isinstance(addr, list) or len(addr) != 2:
        raise ProtocolError('UPDATE_INFO needs "addr": [host_or_null, port]')
    if addr[0] is not None:
        _text(addr[0], "address", MAX_ADDR_CHARS)
    _port(addr[1], "addr port")
    if "key" in info:
        _text(info["key"], "info key", MAX_KEY_CHARS + 16)
    if "protocol" in info:
        _text(info["protocol"], "protocol", MAX_PROTOCOL_CHARS, allow_empty=True)
    if UNREACHABLE not in info:
        return UpdateInfo(info)
    info = dict(info)
    return UpdateInfo(info, _parse_unreachable(info.pop(UNREACHABLE)))


def _parse_unreachable(report) -> Unreachable:
    if not isinstance(report, dict) or not isinstance(report.get("addr"), list) or len(report["addr"]) != 2:
        raise ProtocolError(f'"{UNREACHABLE}" is {{"key": KEY, "addr": [host, port], "matchkey": MATCHKEY}}')
    return Unreachable(_text(report.get("key"), "key", MAX_KEY_CHARS),
                       _text(report["addr"][0], "address", MAX_ADDR_CHARS), _port(report["addr"][1]),
                       _text(report.get("matchkey"), "match key", MAX_MATCHKEY_CHARS))


def _parse_stop(msg: list) -> Stop:
    return Stop(msg[1] if len(msg) > 1 else None)


_PARSERS = {
    TrackerCode.PUT: _parse_put,
    TrackerCode.REQUEST: _parse_request,
    TrackerCode.UPDATE_INFO: _parse_update_info,
    TrackerCode.STOP: _parse_stop,
    TrackerCode.PING: lambda msg: Simple(TrackerCode.PING),
    TrackerCode.SUMMARY: lambda msg: Simple(TrackerCode.SUMMARY),
    TrackerCode.GET_PENDING_MATCHKEYS: lambda msg: Simple(TrackerCode.GET_PENDING_MATCHKEYS),
}


def parse_message(msg) -> Put | Request | UpdateInfo | Simple | Stop:
    """Turn one decoded JSON message into a command; raise ProtocolError with the reason."""
    if type(msg) is list and msg and type(msg[0]) is int:
        parser = _PARSERS.get(msg[0])
        if parser is not None:
            return parser(msg)
    if not isinstance(msg, list) or not msg or isinstance(msg[0], bool) or not isinstance(msg[0], int):
        raise ProtocolError("a tracker message is a JSON list starting with an integer code")
    parser = _PARSERS.get(msg[0])
    if parser is None:
        known = msg[0] in TrackerCode.__members__.values()
        raise ProtocolError(f"tracker code {msg[0]} is a reply code, not a request" if known
                            else f"unknown tracker code {msg[0]}")
    return parser(msg)
