"""Sans-IO codec for Apache TVM's tracker protocol (``docs/tvm-wire-formats.md`` section 2).

A connection opens with the 4-byte magic (sent alone, echoed back), then carries
frames of ``i32 length`` + UTF-8 JSON in both directions.

The JSON is ``json.dumps``/``json.loads``'s, byte for byte, made by the C half of ``json``
(``_json``) that they run on: the ``json`` package itself imports ``re`` and compiles its
patterns, which would cost a process's first ``connect_tracker()`` more than everything
else it does (docs/performance.md, "Start-up and first use"). For the same reason the
lengths are ``int.to_bytes`` rather than ``struct``, and the message codes plain ints
(:class:`Code`), with TVM's ``TrackerCode`` enum made when first asked for.
"""
from __future__ import annotations

from ..errors import ProtocolError

try:
    from _json import encode_basestring_ascii as _encode_str
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner
except ImportError:                 # not CPython: the json module does it all
    _make_scanner = _make_encoder = None
    from json.encoder import encode_basestring_ascii as _encode_str

MAX_FRAME_BYTES = 1 << 20
"""TVM's tracker limit (``MAX_TRACKER_MSG_BYTES``); also ours."""
MAX_PROTOCOL_CHARS = 64
"""The longest ``protocol`` a server's UPDATE_INFO may carry (the tracker refuses a longer one;
the proxy cuts a device's to it)."""

RPC_TRACKER_MAGIC = 0x2F271
MAGIC_BYTES = RPC_TRACKER_MAGIC.to_bytes(4, "little")


class Code:
    """TVM's ``TrackerCode`` values as plain ints.

    :data:`TrackerCode` is the ``enum.IntEnum`` of them, made on first use: a client that
    only talks to a tracker does not load ``enum`` for it.
    """

    FAIL = -1
    SUCCESS = 0
    PING = 1
    STOP = 2
    PUT = 3
    REQUEST = 4
    UPDATE_INFO = 5
    SUMMARY = 6
    GET_PENDING_MATCHKEYS = 7


def __getattr__(name: str):
    if name != "TrackerCode":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import enum

    members = {key: value for key, value in vars(Code).items() if key.isupper()}
    globals()["TrackerCode"] = code = enum.IntEnum("TrackerCode", members, module=__name__)
    return code


class _JSONDefaults:
    """What ``json.JSONDecoder()`` gives its C scanner: the defaults of ``json.loads``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_SCAN_ONCE = _make_scanner(_JSONDefaults()) if _make_scanner is not None else None
_JSON_WHITESPACE = " \t\n\r"


def _not_serializable(obj):
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def encode_json(obj) -> str:
    """``json.dumps(obj)`` with its defaults (``", "`` and ``": "`` separators, ASCII only)."""
    if _make_encoder is None:
        import json

        return json.dumps(obj)
    # A new encoder per call, as json.dumps makes one: its circular-reference marks are per call.
    return "".join(_make_encoder({}, _not_serializable, _encode_str, None, ": ", ", ", False, False, True)(obj, 0))


def encode_frame(obj) -> bytes:
    """One frame, with ``json.dumps`` default separators so traffic matches TVM's byte for byte."""
    data = encode_json(obj).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"tracker message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return len(data).to_bytes(4, "little") + data


def encode_address_reply(host: str, port, matchkey: str) -> bytes:
    """``encode_frame([SUCCESS, [host, port, matchkey]])`` without the generic encoder.

    The reply to every REQUEST has this shape; ``port`` is an int or a numeric string
    (both validated on the way in), so the result stays far below the frame limit.
    """
    body = b'[0, [%s, %s, %s]]' % (_encode_str(host).encode(),
                                   (_encode_str(port) if isinstance(port, str) else int.__repr__(port)).encode(),
                                   _encode_str(matchkey).encode())
    return len(body).to_bytes(4, "little") + body


def decode_json(text: str):
    """``json.loads(text)`` for a str (on CPython without loading ``json``, whose errors it raises)."""
    if _SCAN_ONCE is not None:
        start = len(text) - len(text.lstrip(_JSON_WHITESPACE))
        try:
            obj, end = _SCAN_ONCE(text, start)
        except StopIteration:
            pass                     # nothing valid there: json.loads says what is wrong
        else:
            if end == len(text) or not text[end:].strip(_JSON_WHITESPACE):
                return obj
    import json

    return json.loads(text)


def check_magic(data: bytes) -> None:
    if data != MAGIC_BYTES:
        raise ProtocolError(f"not a tracker peer: expected magic {MAGIC_BYTES.hex(' ')}, got {data[:4].hex(' ')}")


class FrameDecoder:
    """Splits a byte stream into decoded JSON messages, bounding every length."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data) -> list:
        """Append ``data`` (bytes-like; copied) and return the messages now complete.

        Frames are UTF-8 JSON, decoded as TVM's tracker does (``json.loads(py_str(...))``).
        """
        buf = self._buf
        if buf:                     # a partial frame is waiting: decode from the joined bytes
            buf += data
            data = buf
        out = []
        pos, end = 0, len(data)
        while end - pos >= 4:
            n = int.from_bytes(data[pos:pos + 4], "little", signed=True)
            if n <= 0 or n > self._max:
                raise ProtocolError(f"tracker frame length {n} is outside [1, {self._max}]")
            if end - pos - 4 < n:
                break
            try:
                out.append(decode_json(str(data[pos + 4:pos + 4 + n], "utf-8")))
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError(f"tracker frame is not valid JSON: {exc}") from None
            except RecursionError:
                raise ProtocolError("tracker frame nests JSON too deeply to decode") from None
            pos += 4 + n
        if data is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]       # copied: ``data`` may be a buffer the caller reuses
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
