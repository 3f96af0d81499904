"""Sans-IO codec for Apache TVM's tracker protocol (``docs/tvm-wire-formats.md`` section 2).

A connection opens with the 4-byte magic (sent alone, echoed back), then carries
frames of ``i32 length`` + UTF-8 JSON in both directions.
"""
from __future__ import annotations

import enum
import json
import json.scanner
import struct

from ..errors import ProtocolError

MAX_FRAME_BYTES = 1 << 20
"""TVM's tracker limit (``MAX_TRACKER_MSG_BYTES``); also ours."""

RPC_TRACKER_MAGIC = 0x2F271
MAGIC_BYTES = struct.pack("<i", RPC_TRACKER_MAGIC)
_I32 = struct.Struct("<i")
_JSON_DECODER = json.JSONDecoder()
_JSON_ENCODER = json.JSONEncoder()
_SCAN_ONCE = json.scanner.make_scanner(_JSON_DECODER)
_ENCODE_STR = json.encoder.encode_basestring_ascii   # what json.dumps uses with its defaults


class TrackerCode(enum.IntEnum):
    FAIL = -1
    SUCCESS = 0
    PING = 1
    STOP = 2
    PUT = 3
    REQUEST = 4
    UPDATE_INFO = 5
    SUMMARY = 6
    GET_PENDING_MATCHKEYS = 7


def encode_frame(obj) -> bytes:
    """One frame, with ``json.dumps`` default separators so traffic matches TVM's byte for byte."""
    data = _JSON_ENCODER.encode(obj).encode()
    if len(data) > MAX_FRAME_BYTES:
        raise ProtocolError(f"tracker message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return _I32.pack(len(data)) + data


def encode_address_reply(host: str, port, matchkey: str) -> bytes:
    """``encode_frame([SUCCESS, [host, port, matchkey]])`` without the generic encoder.

    The reply to every REQUEST has this shape; ``port`` is an int or a numeric string
    (both validated on the way in), so the result stays far below the frame limit.
    """
    body = b'[0, [%s, %s, %s]]' % (_ENCODE_STR(host).encode(),
                                   (_ENCODE_STR(port) if isinstance(port, str) else int.__repr__(port)).encode(),
                                   _ENCODE_STR(matchkey).encode())
    return _I32.pack(len(body)) + body


def decode_json(text: str):
    """``json.loads(text)`` for a str, with a fast path for the common case of no surrounding whitespace."""
    try:
        obj, end = _SCAN_ONCE(text, 0)
    except StopIteration:           # leading whitespace, or nothing valid: let the full decoder decide
        return _JSON_DECODER.decode(text)
    if end == len(text):
        return obj
    return _JSON_DECODER.decode(text)   # trailing whitespace is fine, anything else is an error


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
            n = _I32.unpack_from(data, pos)[0]
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
