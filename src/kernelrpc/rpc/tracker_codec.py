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
    data = json.dumps(obj).encode()
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

    def feed(self, data: bytes) -> list:
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            n = _I32.unpack_from(self._buf)[0]
            if n <= 0 or n > self._max:
                raise ProtocolError(f"tracker frame length {n} is outside [1, {self._max}]")
            if len(self._buf) < 4 + n:
                break
            raw = bytes(self._buf[4:4 + n])
            del self._buf[:4 + n]
            try:
                out.append(json.loads(raw))
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError(f"tracker frame is not valid JSON: {exc}") from None
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
