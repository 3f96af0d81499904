"""The session's hello (docs/protocol.md): the version exchange that opens a session, after TVM's
handshake (``handshake.py``). The client sends a packet framed exactly like TVM's ``kInitServer``
but carrying the version string ``"kernelrpc/1"``, and the server answers with a TVM-framed
``kReturn`` (accepted, with the session's limits) or ``kException`` (refused, naming both
versions). Using TVM's framing for this one exchange means that each side can tell a TVM peer
apart and tell it why, in a form that peer displays, instead of hanging. Sans-IO."""
from __future__ import annotations

import dataclasses
import json
import re
import struct

from ..errors import ProtocolError, VersionMismatch
from .protocol import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE, MIN_MAX_FRAME_BYTES, NOTICE, decode_notice, notice_error
from .requests import MAX_NAME_BYTES, OPTIONAL_OPS
from .version import PROTOCOL_NAME, VERSION_STRING

MAX_HELLO_BYTES = 4096
MAX_HELLO_REPLY_BYTES = 1 << 20
_U64 = struct.Struct("<Q")

# TVM packet pieces used only by the hello (docs/tvm-wire-formats.md section 5).
_TVM_HEAD = struct.Struct("<Qi")
_TVM_INIT_SERVER, _TVM_RETURN, _TVM_EXCEPTION = 2, 4, 5
_TVM_RAWSTR = 8
_TVM_STR_HEAD = struct.Struct("<iQ")
_TVM_NARGS = struct.Struct("<i")
_TVM_ACCEPTED = _TVM_NARGS.pack(1) + _TVM_NARGS.pack(0)  # kReturn [None]: a TVM server said yes


def _tvm_packet(code: int, body: bytes) -> bytes:
    return _TVM_HEAD.pack(len(body) + 4, code) + body


def _tvm_rawstr(text: str) -> bytes:
    raw = text.encode()
    return _TVM_STR_HEAD.pack(_TVM_RAWSTR, len(raw)) + raw


def encode_hello(version: str = VERSION_STRING) -> bytes:
    """The client's first packet: TVM's kInitServer carrying our version string, no arguments."""
    raw = version.encode()
    return _tvm_packet(_TVM_INIT_SERVER, _U64.pack(len(raw)) + raw + _TVM_NARGS.pack(0))


def encode_hello_accept(info: dict) -> bytes:
    """The server's acceptance: TVM kReturn with [version, JSON of the session's limits].

    ``ops`` lists the optional requests (requests.OPTIONAL_OPS) this server serves, so that a
    client uses them only with a server that has them.
    """
    info = {**info, "ops": sorted(int(op) for op in OPTIONAL_OPS)}
    body = _TVM_NARGS.pack(2) + _tvm_rawstr(VERSION_STRING) + _tvm_rawstr(json.dumps(info))
    return _tvm_packet(_TVM_RETURN, body)


def encode_hello_refuse(message: str) -> bytes:
    """A TVM kException: TVM clients raise it as an RPCError carrying ``message``."""
    return _tvm_packet(_TVM_EXCEPTION, _TVM_NARGS.pack(1) + _tvm_rawstr(message))


def describe_version(version: str) -> str:
    if version.startswith(PROTOCOL_NAME + "/"):
        return f"kernelrpc session protocol {version}"
    return f"TVM RPC protocol {version}"


def check_client_version(version: str) -> None:
    """Raise VersionMismatch naming both versions unless ``version`` is ours."""
    if version == VERSION_STRING:
        return
    advice = ("use kernelrpc.rpc.connect (or the kernelrpc release that matches this server)"
              if version.startswith(PROTOCOL_NAME + "/") else
              "connect with kernelrpc.rpc.connect, or point TVM clients at a TVM rpc_server")
    raise VersionMismatch(
        f"version mismatch: this kernelrpc server speaks kernelrpc session protocol {VERSION_STRING}, "
        f"the client speaks {describe_version(version)}; {advice}", ours=VERSION_STRING, theirs=version)


class _TVMPacketParser:
    """Collects one TVM-framed packet (``u64 nbytes, i32 code, body``) of bounded size."""

    def __init__(self, limit: int, what: str) -> None:
        self._buf = bytearray()
        self._limit = limit
        self._what = what
        self.unused = b""

    def _packet(self, data) -> tuple[int, memoryview] | None:
        self._buf += data
        if len(self._buf) < _TVM_HEAD.size:
            return None
        nbytes, code = _TVM_HEAD.unpack_from(self._buf)
        if nbytes < 4 or nbytes > self._limit:
            raise ProtocolError(
                f"{self._what}: first bytes {bytes(self._buf[:12]).hex(' ')} announce a {nbytes}-byte "
                f"packet; the peer speaks neither kernelrpc's nor TVM's session protocol")
        if len(self._buf) < 8 + nbytes:
            return None
        self.unused = bytes(self._buf[8 + nbytes:])
        return code, memoryview(self._buf)[12:8 + nbytes]


def _read_tvm_strings(body: memoryview, what: str) -> list[str]:
    if len(body) < 4:
        raise ProtocolError(f"{what}: truncated argument list")
    (count,) = _TVM_NARGS.unpack_from(body)
    pos, out = 4, []
    if not 0 <= count <= 16:
        raise ProtocolError(f"{what}: unexpected argument count {count}")
    for _ in range(count):
        if pos + _TVM_STR_HEAD.size > len(body):
            raise ProtocolError(f"{what}: truncated argument")
        type_index, n = _TVM_STR_HEAD.unpack_from(body, pos)
        pos += _TVM_STR_HEAD.size
        if type_index != _TVM_RAWSTR or n > len(body) - pos:
            raise ProtocolError(f"{what}: expected string arguments")
        out.append(str(body[pos:pos + n], "utf-8", "replace"))
        pos += n
    return out


class HelloParser(_TVMPacketParser):
    """Server side: ``feed`` returns the client's version string once the hello is complete."""

    def __init__(self) -> None:
        super().__init__(MAX_HELLO_BYTES, "session hello")

    def feed(self, data) -> str | None:
        packet = self._packet(data)
        if packet is None:
            return None
        code, body = packet
        if code != _TVM_INIT_SERVER:
            raise ProtocolError(f"session hello: the first packet has code {code}, expected the "
                                f"version exchange (kInitServer, {_TVM_INIT_SERVER})")
        if len(body) < 8:
            raise ProtocolError("session hello: truncated version string")
        (n,) = _U64.unpack_from(body)
        if n > len(body) - 8 or n > 64:
            raise ProtocolError(f"session hello: version string length {n} is out of range")
        try:
            return str(body[8:8 + n], "ascii")
        except UnicodeDecodeError:
            raise ProtocolError("session hello: the version string is not ASCII") from None


@dataclasses.dataclass(frozen=True)
class HelloReply:
    version: str
    info: dict


_INFO_LIMITS = {  # field: (default, lowest, highest)
    "session_timeout": (0, 0, 10 * 365 * 86400),
    "max_frame_bytes": (DEFAULT_MAX_FRAME_BYTES, MIN_MAX_FRAME_BYTES, (1 << 32) - 1),
    "max_upload_bytes": (1 << 30, 0, 1 << 50),
    "max_tensor_bytes": (8 << 30, 0, 1 << 50),
    # What a pipelined empty() (ALLOCATE) needs to know; 0 (an older server): nothing is pipelined.
    "max_session_bytes": (0, 0, 1 << 60),
    "max_client_tensors": (0, 0, 1 << 32),
}


MAX_GLOBALS_LISTED = 1024
"""The most global function names a hello may list (``globals``: what a pipelined get_function
may look up)."""


def _checked_info(info: dict) -> dict:
    """The server's session limits, each a number within bounds (defaults for missing ones), and
    its global functions' names (none from an older server)."""
    out = dict(info)
    for name, (default, low, high) in _INFO_LIMITS.items():
        value = info.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ProtocolError(f"session hello reply: {name}={value!r} is out of range")
        out[name] = value
    names = info.get("globals", [])
    if not isinstance(names, list) or len(names) > MAX_GLOBALS_LISTED or not all(
            type(n) is str and len(n.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES for n in names):
        raise ProtocolError(f"session hello reply: globals is not a list of at most {MAX_GLOBALS_LISTED} "
                            f"names of at most {MAX_NAME_BYTES} bytes")
    out["globals"] = names
    return out


_KERNELRPC_SERVER_VERSION = re.compile(r"server speaks kernelrpc session protocol ([\w./]+),")
_TVM_SERVER_VERSION = re.compile(r"server protocol=([\w.]+)")


class HelloReplyParser(_TVMPacketParser):
    """Client side: ``feed`` returns a HelloReply, or raises VersionMismatch / ProtocolError."""

    def __init__(self) -> None:
        super().__init__(MAX_HELLO_REPLY_BYTES, "session hello reply")

    def feed(self, data) -> HelloReply | None:
        self._buf += data
        if len(self._buf) > 4 and self._buf[4] == NOTICE:
            self._raise_notice()
            return None
        packet = self._packet(b"")
        if packet is None:
            return None
        code, body = packet
        if code == _TVM_RETURN and bytes(body) == _TVM_ACCEPTED:
            raise VersionMismatch(
                f"version mismatch: this client speaks kernelrpc session protocol {VERSION_STRING}, "
                "the server accepted the hello as a TVM RPC session: it speaks TVM RPC; use tvm.rpc",
                ours=VERSION_STRING, theirs="TVM RPC")
        strings = _read_tvm_strings(body, "session hello reply")
        if code == _TVM_EXCEPTION and len(strings) == 1:
            raise self._refusal(strings[0])
        if code != _TVM_RETURN or len(strings) != 2:
            raise ProtocolError(f"session hello reply: unexpected TVM packet code {code} with "
                                f"{len(strings)} values")
        version, info_text = strings
        if version != VERSION_STRING:
            raise VersionMismatch(
                f"version mismatch: this client speaks {VERSION_STRING}, the server {describe_version(version)}",
                ours=VERSION_STRING, theirs=version)
        try:
            info = json.loads(info_text)
        except ValueError:
            raise ProtocolError("session hello reply: server info is not JSON") from None
        if not isinstance(info, dict):
            raise ProtocolError("session hello reply: server info is not an object")
        return HelloReply(version, _checked_info(info))

    def _raise_notice(self) -> None:
        """The server's parent ended the session before the child answered (it crashed, was
        killed, or the server shuts down): a NOTICE frame where the reply would be.  A TVM
        reply's fifth byte is 0 (its u64 length is below 4 GiB), a NOTICE header's is 5."""
        (length,) = struct.unpack_from("<I", self._buf)
        if length > MAX_HELLO_BYTES:
            raise ProtocolError(f"session hello reply: a NOTICE frame of {length} bytes")
        if len(self._buf) >= HEADER_SIZE + length:
            raise notice_error(*decode_notice(bytes(self._buf[HEADER_SIZE:HEADER_SIZE + length])))

    @staticmethod
    def _refusal(message: str) -> VersionMismatch:
        kernelrpc_server = _KERNELRPC_SERVER_VERSION.search(message)
        if kernelrpc_server:
            return VersionMismatch(message, ours=VERSION_STRING, theirs=kernelrpc_server.group(1))
        found = _TVM_SERVER_VERSION.search(message)
        theirs = found.group(1) if found else "unknown"
        return VersionMismatch(
            f"version mismatch: this client speaks kernelrpc session protocol {VERSION_STRING}, the server "
            f"refused it and looks like a TVM RPC server (TVM RPC protocol {theirs}); its message: "
            f"{message.strip()[:500]}", ours=VERSION_STRING, theirs=theirs)
