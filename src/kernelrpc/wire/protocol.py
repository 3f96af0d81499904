"""Sans-IO codec for kernelrpc's session protocol (see docs/protocol.md).

A session starts, after TVM's handshake (``handshake.py``), with a *hello* (``hello.py``).
After the hello both sides exchange frames: ``u32 body_length, u8 type, body``.
Some requests and replies are followed by a raw byte stream whose length the
frame announces; the transport moves those bytes straight into and out of
buffers, so they never pass through this codec.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from ..errors import ConnectionLost, ProtocolError, RPCError, ServerCrashed, SessionTimeout
from .requests import OP_OF, WITH_RAW_INPUT, Call, Op, from_values, to_values
from .values import T_FLOAT, T_FUNCTION, T_INT, decode_items, decode_single, decode_values, encode_items, encode_values
from .version import PROTOCOL_NAME, PROTOCOL_VERSION, VERSION_STRING  # noqa: F401 (re-exported)

DEFAULT_MAX_FRAME_BYTES = 64 << 20
MIN_MAX_FRAME_BYTES = 4096

# Frame types.
REQUEST, RETURN, ERROR, DATA, NOTICE = 1, 2, 3, 4, 5
FRAME_NAMES = {REQUEST: "REQUEST", RETURN: "RETURN", ERROR: "ERROR", DATA: "DATA", NOTICE: "NOTICE"}

# Request operations (first byte of a REQUEST body): the values of the Op enum, as plain ints for
# the per-message paths (reading ``Op.CALL`` costs ~0.3 us, comparing with a member twice an int's).
(GET_GLOBAL, LOAD_MODULE, GET_FUNCTION, CALL, FREE, EMPTY, COPY_TO, COPY_FROM, UPLOAD, DOWNLOAD, REMOVE,
 LISTDIR, TIME_EVALUATOR, SHUTDOWN, LIST_GLOBALS, RELEASE, ARRAY, TIME_EVALUATOR_PACKED,
 ALLOCATE, GLOBAL_AT) = (int(op) for op in Op)
OPS = {op.value: op.name for op in Op}
OPS_WITH_RAW_INPUT = WITH_RAW_INPUT

# NOTICE kinds: the server's parent process ended the session.
NOTICE_TIMEOUT = "SessionTimeout"
NOTICE_CRASHED = "ServerCrashed"
NOTICE_SHUTDOWN = "ServerShutdown"

FRAME_HEADER = struct.Struct("<IB")
HEADER_SIZE = FRAME_HEADER.size
_U64 = struct.Struct("<Q")


class Frame(NamedTuple):
    type: int
    body: bytes


_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (per-message paths)


# ---------------------------------------------------------------- frames

def encode_frame(frame_type: int, body: bytes = b"") -> bytes:
    return FRAME_HEADER.pack(len(body), frame_type) + body


def parse_header(header, max_frame_bytes: int) -> tuple[int, int]:
    """Return ``(type, body_length)`` of a 5-byte frame header, checking both."""
    length, frame_type = FRAME_HEADER.unpack(header)
    if frame_type not in FRAME_NAMES:
        raise ProtocolError(f"unknown frame type {frame_type} (header {bytes(header).hex(' ')}); "
                            "the peer does not speak kernelrpc's session protocol")
    if length > max_frame_bytes:
        raise ProtocolError(f"{FRAME_NAMES[frame_type]} frame of {length} bytes exceeds the limit of "
                            f"{max_frame_bytes} bytes (max_frame_bytes)")
    return frame_type, length


class FrameReader:
    """Splits a byte stream into frames; also hands out buffered bytes for raw streams."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.pending = 0  # bytes fed and not yet handed out
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data
        self.pending = len(self._buf) - self._pos

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed."""
        pos = self._pos
        avail = len(self._buf) - pos
        if avail < HEADER_SIZE:
            return None
        length, frame_type = FRAME_HEADER.unpack_from(self._buf, pos)
        if frame_type not in FRAME_NAMES or length > self.max_frame_bytes:
            parse_header(self._buf[pos:pos + HEADER_SIZE], self.max_frame_bytes)  # raises
        if avail < HEADER_SIZE + length:
            return None
        body = bytes(self._buf[pos + HEADER_SIZE:pos + HEADER_SIZE + length])
        self._advance(HEADER_SIZE + length)
        return _tuple_new(Frame, (frame_type, body))

    def whole_frame(self, chunk: bytes) -> Frame | None:
        """The frame that ``chunk`` is, if it is exactly one valid frame (the transport's one-read case).

        Only for a reader with nothing buffered; anything else (part of a frame, several, a bad
        header) is None, left to ``feed`` and ``next_frame``, which judge it alike.
        """
        if len(chunk) < HEADER_SIZE:
            return None
        length, frame_type = FRAME_HEADER.unpack_from(chunk)
        if length + HEADER_SIZE != len(chunk) or frame_type not in FRAME_NAMES \
                or length > self.max_frame_bytes:
            return None
        return _tuple_new(Frame, (frame_type, chunk[HEADER_SIZE:]))

    def take(self, n: int) -> bytes:
        """Up to ``n`` already buffered bytes (the start of a raw stream)."""
        n = min(n, len(self._buf) - self._pos)
        chunk = bytes(self._buf[self._pos:self._pos + n])
        self._advance(n)
        return chunk

    def _advance(self, n: int) -> None:
        self._pos += n
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > 1 << 16:
            del self._buf[:self._pos]
            self._pos = 0
        self.pending = len(self._buf) - self._pos


# ---------------------------------------------------------------- requests and replies

_REQUEST_HEAD = struct.Struct("<IBB")  # frame header, op
_CALL_BODY = struct.Struct("<BIBQ")    # op, value count, function handle (tag, id)
CALL_HEAD = struct.Struct("<IB" + _CALL_BODY.format[1:])  # the same after the frame header
_CALL_FIXED = _CALL_BODY.size
_RESULT_HEAD = struct.Struct("<IBI")  # frame header, value count (1)


def encode(request) -> bytes:
    """The REQUEST frame of a request (one of the types in requests.py)."""
    if type(request) is Call:
        return encode_call(request.function_id, request.args)
    return encode_request(OP_OF[type(request)], to_values(request))


def encode_request(op: int, values=()) -> bytes:
    """The REQUEST frame of ``op`` with ``values`` as they are (tests use it to send bad requests)."""
    payload = encode_values(values)
    return _REQUEST_HEAD.pack(len(payload) + 1, REQUEST, op) + payload


def decode_request(body):
    """The request in a REQUEST frame's body, checked (requests.from_values); ProtocolError if not."""
    if not body:
        raise ProtocolError("empty REQUEST frame")
    if body[0] == CALL:
        return decode_call(body)
    return from_values(body[0], decode_values(body, 1))


# CALL and its RETURN are what a measurement loop repeats, so they have their own codec functions.
# They make and accept exactly the bytes of encode(Call(...)) / encode_return([result]) (tests
# check this on every input), with one struct operation for the head instead of a value each, and
# one for the whole message in the commonest case: no argument or one int or float, an int or
# float result (the gains are in docs/performance.md). The decoders of a whole CALL or RETURN
# frame straight from one read are the session connection's fast lanes (connection.py), which reads
# the layouts below (public for it).
_SCALAR_LENGTH = 9  # an int or float value: tag and 8 bytes
_CALL_INT = struct.Struct(CALL_HEAD.format + "Bq")      # a whole CALL with one int argument
_CALL_FLOAT = struct.Struct(CALL_HEAD.format + "Bd")
_RESULT_INT = struct.Struct(_RESULT_HEAD.format + "Bq")  # a whole RETURN of one int
_RESULT_FLOAT = struct.Struct(_RESULT_HEAD.format + "Bd")
_SCALAR_CALL_LENGTH = _CALL_FIXED + _SCALAR_LENGTH
_SCALAR_RESULT_LENGTH = 4 + _SCALAR_LENGTH
OP_OFFSET = HEADER_SIZE
# The whole-frame checks of the one-int CALL and RETURN: the bytes that do not vary (header, op,
# count, tags) compared at once, the rest unpacked in the same struct operation.
CALL_INT_PREFIX = _CALL_INT.pack(_SCALAR_CALL_LENGTH, REQUEST, CALL, 2, T_FUNCTION, 0, T_INT, 0)[:CALL_HEAD.size - 8]
_CALL_INT_FRAME = struct.Struct(f"<{len(CALL_INT_PREFIX)}sQBq")    # prefix, function id, tag, value
RESULT_INT_PREFIX = _RESULT_INT.pack(_SCALAR_RESULT_LENGTH, RETURN, 1, T_INT, 0)[:HEADER_SIZE + 5]
_RESULT_INT_FRAME = struct.Struct(f"<{len(RESULT_INT_PREFIX)}sq")  # prefix, value
# Their methods and sizes as module globals: one lookup each on the per-message paths, not two.
_pack_call_int_frame, unpack_call_int_frame = _CALL_INT_FRAME.pack, _CALL_INT_FRAME.unpack
_pack_result_int_frame, unpack_result_int_frame = _RESULT_INT_FRAME.pack, _RESULT_INT_FRAME.unpack
CALL_INT_FRAME_SIZE, RESULT_INT_FRAME_SIZE = _CALL_INT_FRAME.size, _RESULT_INT_FRAME.size
CALL_HEAD_SIZE = CALL_HEAD.size


def encode_call(function_id: int, args=(), max_frame_bytes: int | None = None, to_wire=None) -> bytes:
    """A CALL request of function ``function_id`` with ``args``; ValueError if it is longer than
    ``max_frame_bytes`` (the server's frame limit, when given).

    ``args`` are wire values, or whatever ``to_wire(args)`` turns into wire values (the client's
    session converts its remote objects and arrays); it is not called for one int or float, so
    the trivial call converts nothing.
    """
    if len(args) == 1:
        kind = type(args[0])
        try:
            if kind is int:  # the constant bytes in one piece: fewer arguments to pack
                return _pack_call_int_frame(CALL_INT_PREFIX, function_id, T_INT, args[0])
            if kind is float:
                return _CALL_FLOAT.pack(_SCALAR_CALL_LENGTH, REQUEST, CALL, 2, T_FUNCTION, function_id,
                                        T_FLOAT, args[0])
        except struct.error:
            pass  # out of range: encode_items below names the value
    if to_wire is not None:
        args = to_wire(args)
    payload = encode_items(args)
    if max_frame_bytes is not None and _CALL_FIXED + len(payload) > max_frame_bytes:
        raise ValueError(f"the arguments of this call take {HEADER_SIZE + _CALL_FIXED + len(payload)} "
                         f"bytes, more than the server's frame limit of {max_frame_bytes} bytes; pass "
                         "large arrays as remote tensors (sess.empty(...).copyfrom(array))")
    return CALL_HEAD.pack(_CALL_FIXED + len(payload), REQUEST, CALL, len(args) + 1, T_FUNCTION,
                           function_id) + payload


def decode_call(body: bytes) -> Call:
    """The Call in a CALL request body."""
    if len(body) < _CALL_FIXED or body[0] != CALL:
        if body and body[0] == CALL:
            raise ProtocolError("CALL needs a function handle first")
        raise ProtocolError("malformed CALL request")
    _, count, tag, function_id = _CALL_BODY.unpack_from(body)
    if tag != T_FUNCTION or count == 0:
        raise ProtocolError("CALL needs a function handle first")
    return _tuple_new(Call, (function_id, decode_items(body, _CALL_FIXED, count - 1)))


def encode_result(value) -> bytes:
    """A RETURN frame carrying the one value of a CALL's result."""
    kind = type(value)
    if kind is int:
        try:
            return _pack_result_int_frame(RESULT_INT_PREFIX, value)
        except struct.error:
            pass  # out of range: encode_items below says so
    elif kind is float:
        return _RESULT_FLOAT.pack(_SCALAR_RESULT_LENGTH, RETURN, 1, T_FLOAT, value)
    elif value is None:  # a kernel's result
        return NONE_RESULT
    payload = encode_items((value,))
    return _RESULT_HEAD.pack(len(payload) + 4, RETURN, 1) + payload


NONE_RESULT = _RESULT_HEAD.pack(5, RETURN, 1) + encode_items((None,))

decode_result = decode_single
"""The one value of a CALL's RETURN body (a shortcut for one int here gained ~50 ns: folded back)."""


def encode_return(values=()) -> bytes:
    return encode_frame(RETURN, encode_values(values)) if values else _EMPTY_RETURN


_EMPTY_RETURN = encode_frame(RETURN, encode_values(()))  # COPY_TO's, FREE's, REMOVE's reply


def encode_error(type_name: str, message: str, traceback_text: str = "") -> bytes:
    return encode_frame(ERROR, encode_values([type_name, message, traceback_text]))


def decode_error(body) -> tuple[str, str, str]:
    values = decode_values(body)
    if len(values) != 3 or not all(isinstance(v, str) for v in values):
        raise ProtocolError("malformed ERROR frame")
    return values[0], values[1], values[2]


def encode_data_header(nbytes: int) -> bytes:
    """A DATA frame announcing ``nbytes`` raw bytes that follow it."""
    return encode_frame(DATA, _U64.pack(nbytes))


def decode_data_header(body) -> int:
    if len(body) != _U64.size:
        raise ProtocolError("malformed DATA frame")
    return _U64.unpack(body)[0]


def encode_notice(kind: str, message: str, signal: int | None = None, exit_code: int | None = None) -> bytes:
    return encode_frame(NOTICE, encode_values([kind, message, signal, exit_code]))


def decode_notice(body) -> tuple[str, str, int | None, int | None]:
    values = decode_values(body)
    if (len(values) != 4 or not isinstance(values[0], str) or not isinstance(values[1], str)
            or not all(v is None or type(v) is int for v in values[2:])):
        raise ProtocolError("malformed NOTICE frame")
    return values[0], values[1], values[2], values[3]


def notice_error(kind: str, message: str, signal: int | None = None, exit_code: int | None = None) -> RPCError:
    """The typed error a NOTICE (``decode_notice``'s fields) stands for."""
    if kind == NOTICE_TIMEOUT:
        return SessionTimeout(message)
    if kind == NOTICE_CRASHED:
        return ServerCrashed(message, signal=signal, exit_code=exit_code)
    return ConnectionLost(f"the server ended the session: {kind}: {message}")
