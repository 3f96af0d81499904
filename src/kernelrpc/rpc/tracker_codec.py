"""Sans-IO codec for Apache TVM's tracker protocol (``tvm-rpc-protocol.md`` section 2).

A connection opens with the 4-byte magic (sent alone, echoed back), then carries
frames of ``i32 length`` + UTF-8 JSON in both directions.
"""
from __future__ import annotations

import enum
import json
import struct

from ..errors import ProtocolError
from .handshake import RPC_TRACKER_MAGIC

MAX_FRAME_BYTES = 1 << 20
"""TVM's tracker limit (``MAX_TRACKER_MSG_BYTES``); also ours."""

MAGIC_BYTES = struct.pack("<i", RPC_TRACKER_MAGIC)
_I32 = struct.Struct("<i")
_JSON_DECODER = json.JSONDecoder()
_JSON_ENCODER = json.JSONEncoder()


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
        buf += data
        out = []
        pos, end = 0, len(buf)
        while end - pos >= 4:
            n = _I32.unpack_from(buf, pos)[0]
            if n <= 0 or n > self._max:
                raise ProtocolError(f"tracker frame length {n} is outside [1, {self._max}]")
            if end - pos - 4 < n:
                break
            try:
                out.append(_JSON_DECODER.decode(buf[pos + 4:pos + 4 + n].decode()))
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError(f"tracker frame is not valid JSON: {exc}") from None
            pos += 4 + n
        del buf[:pos]
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
