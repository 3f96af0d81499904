"""The server side of WebSocket (RFC 6455) as far as TVM's proxy uses it, sans-IO.

TVM's proxy accepts devices that run in a browser (``--web-port``, path ``/ws``):
they speak the same byte stream as TCP peers (preamble, then the session), cut
into binary messages. This module turns bytes into events and back; the proxy's
sockets live elsewhere.

* :class:`UpgradeRequestParser` reads the HTTP/1.1 upgrade request (bounded) and
  :func:`accept_response` answers it;
* :class:`FrameDecoder` turns client frames into :class:`Data` chunks (streamed as
  they arrive: a 64 MiB message never sits whole in memory), :class:`Ping`,
  :class:`Pong` and :class:`Close` events;
* :func:`encode_frame` writes a frame (unmasked from the server, masked from a client).
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import struct

from ..errors import ProtocolError

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_REQUEST_BYTES = 8192
MAX_CONTROL_PAYLOAD = 125

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
CLOSE_NORMAL, CLOSE_PROTOCOL_ERROR, CLOSE_UNSUPPORTED = 1000, 1002, 1003

_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")


class UpgradeRejected(ProtocolError):
    """The HTTP request is not a WebSocket upgrade we accept; ``response`` says why to the peer."""

    def __init__(self, status: str, reason: str, extra_headers: str = "") -> None:
        super().__init__(f"websocket upgrade refused ({status}): {reason}")
        body = reason.encode() + b"\n"
        self.response = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
                         f"Content-Length: {len(body)}\r\n{extra_headers}Connection: close\r\n\r\n"
                         ).encode() + body


@dataclasses.dataclass(frozen=True)
class UpgradeRequest:
    path: str
    key: str
    leftover: bytes  # bytes after the request (frames the client sent at once)


class UpgradeRequestParser:
    """Collects the request head (at most ``MAX_REQUEST_BYTES``) and validates it."""

    def __init__(self, path: str = "/ws") -> None:
        self._path = path
        self._buf = bytearray()

    def feed(self, data: bytes) -> UpgradeRequest | None:
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        head_bytes = end + 4 if end >= 0 else len(self._buf)  # so far, while incomplete
        if head_bytes > MAX_REQUEST_BYTES:
            raise UpgradeRejected("431 Request Header Fields Too Large",
                                  f"request head over {MAX_REQUEST_BYTES} bytes")
        if end < 0:
            return None
        head, leftover = bytes(self._buf[:end]), bytes(self._buf[end + 4:])
        try:
            lines = head.decode("ascii").split("\r\n")
        except UnicodeDecodeError:
            raise UpgradeRejected("400 Bad Request", "request head is not ASCII") from None
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise UpgradeRejected("400 Bad Request", f"not an HTTP/1.1 request line: {lines[0][:80]!r}")
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise UpgradeRejected("400 Bad Request", f"malformed header line {line[:80]!r}")
            headers[name.lower()] = value.strip()
        if method != "GET":
            raise UpgradeRejected("405 Method Not Allowed", "only GET upgrades to a websocket",
                                  "Allow: GET\r\n")
        if target.split("?", 1)[0] != self._path:
            raise UpgradeRejected("404 Not Found", f"the websocket endpoint is {self._path}")
        if headers.get("upgrade", "").lower() != "websocket" or "upgrade" not in {
                token.strip().lower() for token in headers.get("connection", "").split(",")}:
            raise UpgradeRejected("426 Upgrade Required", "this port speaks WebSocket only",
                                  "Upgrade: websocket\r\n")
        if headers.get("sec-websocket-version") != "13":
            raise UpgradeRejected("426 Upgrade Required", "WebSocket version 13 is required",
                                  "Sec-WebSocket-Version: 13\r\n")
        key = headers.get("sec-websocket-key", "")
        try:
            valid_key = len(base64.b64decode(key, validate=True)) == 16
        except ValueError:
            valid_key = False
        if not valid_key:
            raise UpgradeRejected("400 Bad Request", "Sec-WebSocket-Key is not 16 bytes in base64")
        return UpgradeRequest(path=target, key=key, leftover=leftover)


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def accept_response(request: UpgradeRequest) -> bytes:
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_key(request.key)}\r\n\r\n").encode()


def _payload_event(name: str):
    """A frame event that carries its payload: one shape, three names."""
    event = dataclasses.make_dataclass(name, [("payload", bytes)], frozen=True)
    event.__module__ = __name__
    return event


Data = _payload_event("Data")
Ping = _payload_event("Ping")
Pong = _payload_event("Pong")


@dataclasses.dataclass(frozen=True)
class Close:
    code: int | None
    reason: str


_NUMPY_FROM = 4096  # below this the big-integer XOR is as fast and needs no numpy
_numpy = None


def load_numpy():
    """numpy, imported on first use so that a proxy without WebSocket peers never loads it."""
    global _numpy
    if _numpy is None:
        import numpy
        _numpy = numpy
    return _numpy


def _unmask(data: bytes, mask: bytes, offset: int) -> bytes:
    """``data`` XOR the repeated ``mask``, starting at byte ``offset`` of the mask cycle.

    Large chunks go through numpy, 32 bits at a time (2 GB/s against 150 MB/s for the
    big-integer XOR here): unmasking is what bounds a browser peer's upload otherwise.
    """
    n = len(data)
    if not n:
        return b""
    shift = offset % 4
    rotated = mask[shift:] + mask[:shift]
    if n >= _NUMPY_FROM:
        np = load_numpy()
        words = n // 4
        out = np.empty(n, np.uint8)
        np.bitwise_xor(np.frombuffer(data, np.uint32, words), np.frombuffer(rotated, np.uint32)[0],
                       out=out[:words * 4].view(np.uint32))
        if n > words * 4:
            out[words * 4:] = (np.frombuffer(data, np.uint8, offset=words * 4)
                               ^ np.frombuffer(rotated[:n - words * 4], np.uint8))
        return out.tobytes()
    key = (rotated * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


class FrameDecoder:
    """Streams frames from one peer. ``feed`` returns the events its bytes complete.

    Binary messages only (TVM's peers send nothing else); text frames, reserved bits,
    unmasked client frames and oversized or fragmented control frames are protocol
    errors. After a :class:`Close` event the decoder accepts nothing more.
    """

    def __init__(self, require_mask: bool = True) -> None:
        self._require_mask = require_mask
        self._buf = bytearray()
        self._frame: tuple[int, bool, bytes | None, int] | None = None  # opcode, fin, mask, length
        self._done = 0  # payload bytes of the current frame already handled
        self._control = bytearray()
        self._in_message = False
        self._closed = False

    def feed(self, data: bytes) -> list:
        if self._closed:
            raise ProtocolError("websocket: data after the close frame")
        if self._buf:  # the start of a header came with the last feed
            data, self._buf = bytes(self._buf) + data, bytearray()
        view, pos, end = memoryview(data), 0, len(data)
        events: list = []
        while True:
            if self._frame is None:
                at = self._read_header(view, pos)
                if at is None:
                    self._buf = bytearray(view[pos:])
                    return events
                pos = at
            opcode, fin, mask, length = self._frame
            take = min(length - self._done, end - pos)
            chunk = view[pos:pos + take]
            pos += take
            chunk = bytes(chunk) if mask is None else _unmask(chunk, mask, self._done)
            self._done += take
            if opcode in (BINARY, CONTINUATION):
                if chunk:
                    events.append(Data(chunk))
            else:
                self._control += chunk
            if self._done < length:
                return events
            self._frame = None
            if opcode in (BINARY, CONTINUATION):
                self._in_message = not fin
                continue
            payload, self._control = bytes(self._control), bytearray()
            if opcode == PING:
                events.append(Ping(payload))
            elif opcode == PONG:
                events.append(Pong(payload))
            else:
                events.append(self._close_event(payload))
                self._closed = True
                return events

    def _read_header(self, buf: memoryview, pos: int) -> int | None:
        """Parses the frame header at ``buf[pos:]``; where its payload starts, None if incomplete."""
        have = len(buf) - pos
        if have < 2:
            return None
        first, second = buf[pos], buf[pos + 1]
        fin, opcode, masked = bool(first & 0x80), first & 0x0F, bool(second & 0x80)
        if first & 0x70:
            raise ProtocolError("websocket: reserved bits set (no extension was negotiated)")
        if opcode == TEXT:
            raise ProtocolError("websocket: text frame; the RPC stream travels in binary frames")
        if opcode not in (CONTINUATION, BINARY, CLOSE, PING, PONG):
            raise ProtocolError(f"websocket: unknown opcode {opcode:#x}")
        if opcode == CONTINUATION and not self._in_message:
            raise ProtocolError("websocket: continuation frame outside a message")
        if opcode == BINARY and self._in_message:
            raise ProtocolError("websocket: new message before the last one was finished")
        if self._require_mask and not masked:
            raise ProtocolError("websocket: client frames must be masked")
        length, at = second & 0x7F, 2
        if opcode >= CLOSE and (length > MAX_CONTROL_PAYLOAD or not fin):
            raise ProtocolError("websocket: control frames are single frames of at most 125 bytes")
        if length == 126:
            if have < 4:
                return None
            length, at = _U16.unpack_from(buf, pos + 2)[0], 4
        elif length == 127:
            if have < 10:
                return None
            length, at = _U64.unpack_from(buf, pos + 2)[0], 10
            if length >> 63:
                raise ProtocolError("websocket: payload length over 2**63")
        mask = None
        if masked:
            if have < at + 4:
                return None
            mask, at = bytes(buf[pos + at:pos + at + 4]), at + 4
        self._frame, self._done = (opcode, fin, mask, length), 0
        return pos + at

    @staticmethod
    def _close_event(payload: bytes) -> Close:
        if not payload:
            return Close(None, "")
        if len(payload) == 1:
            raise ProtocolError("websocket: close frame with a 1-byte payload")
        try:
            reason = payload[2:].decode()
        except UnicodeDecodeError:
            raise ProtocolError("websocket: close reason is not UTF-8") from None
        return Close(_U16.unpack_from(payload)[0], reason)


def frame_header(opcode: int, length: int, *, masked: bool = False, fin: bool = True) -> bytes:
    """The bytes before a frame's payload (and before its mask, when ``masked``)."""
    mask_bit = 0x80 if masked else 0
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        return bytes((first, mask_bit | length))
    if length < 1 << 16:
        return bytes((first, mask_bit | 126)) + _U16.pack(length)
    return bytes((first, mask_bit | 127)) + _U64.pack(length)


def encode_frame(opcode: int, payload: bytes = b"", *, mask: bytes | None = None,
                 fin: bool = True) -> bytes:
    """One frame; ``mask`` (4 bytes) is what a client must use, a server sends none."""
    head = frame_header(opcode, len(payload), masked=mask is not None, fin=fin)
    if mask is None:
        return head + payload
    if len(mask) != 4:
        raise ValueError("a websocket mask is 4 bytes")
    return head + mask + _unmask(bytes(payload), mask, 0)


def close_frame(code: int = CLOSE_NORMAL, reason: str = "") -> bytes:
    return encode_frame(CLOSE, _U16.pack(code) + reason.encode()[:MAX_CONTROL_PAYLOAD - 2])
