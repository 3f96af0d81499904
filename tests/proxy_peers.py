"""Raw handshake peers for the proxy tests: plain sockets speaking TVM's preamble."""
from __future__ import annotations

import re
import socket
import time

from kernelrpc.rpc import handshake as hs


def connect(address, key: str, timeout: float = 15.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.sendall(hs.encode_preamble(key))
    return sock


def read_reply(sock: socket.socket) -> tuple[hs.Reply, bytes]:
    """The proxy's answer and any bytes that arrived after it."""
    parser = hs.ReplyParser()
    while True:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("proxy closed the connection before replying")
        reply = parser.feed(data)
        if reply is not None:
            return reply, parser.unused


def recv_exactly(sock: socket.socket, n: int, already: bytes = b"") -> bytes:
    buf = bytearray(already)
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def is_closed(sock: socket.socket) -> bool:
    """True once the peer closed (EOF or reset); waits up to the socket timeout."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True


def wait_for_matches(service, pattern: str, count: int = 1, timeout: float = 30.0) -> list[re.Match]:
    """Wait until ``count`` lines of the service's output match ``pattern``."""
    regex = re.compile(pattern)
    end = time.monotonic() + timeout
    while True:
        found = [m for m in map(regex.search, list(service.lines)) if m]
        if len(found) >= count:
            return found
        if time.monotonic() > end or not service._reader.is_alive():
            raise TimeoutError(f"{service.module}: {len(found)} of {count} lines match {pattern!r}; "
                               "output:\n" + "\n".join(service.lines))
        service._reader.join(0.05)


def offered_matchkey(service, device_key: str, nth: int = 1) -> str:
    """The match key the proxy logged for the nth device that waited with ``device_key``."""
    pattern = rf"waits for key '{re.escape(device_key)}' \(offered as (\S+)\)"
    return wait_for_matches(service, pattern, nth)[nth - 1].group(1)
