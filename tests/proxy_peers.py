"""Helpers for the proxy tests: raw handshake peers, tracker probes, service starters.

The ``proxy`` fixture itself is in conftest.py, shared by every test file."""
from __future__ import annotations

import re
import socket
import time

from kernelrpc.wire import handshake as hs
from kernelrpc.wire import tracker_codec as tc
from kernelrpc.server.through_proxy import wait_for_pairing

TVM_TRACKER_READY = re.compile(r"bind to (\S+):(\d+)")
TVM_PROXY_READY = re.compile(r"client port bind to (\S+):(\d+)")


def connect(address, key: str, timeout: float = 15.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.sendall(hs.encode_preamble(key))
    return sock


read_reply = wait_for_pairing  # the proxy's answer and any bytes that arrived after it


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


def free_port_range(width: int = 40) -> tuple[int, int]:
    """A start port that is free now, for TVM services that cannot bind port 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        start = s.getsockname()[1]
    start = min(start, 65535 - width)
    return start, start + width


def start_tvm_tracker(start_service):
    lo, hi = free_port_range()
    return start_service("tvm.exec.rpc_tracker", ["--host", "127.0.0.1", "--port", str(lo),
                                                  "--port-end", str(hi)], ready=TVM_TRACKER_READY)


def start_tvm_proxy(start_service):
    lo, hi = free_port_range()
    return start_service("tvm.exec.rpc_proxy", ["--host", "127.0.0.1", "--port", str(lo),
                                                "--port-end", str(hi), "--web-port", "0"],
                         ready=TVM_PROXY_READY)


def _tracker_call(address, message):
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(tc.MAGIC_BYTES)
        tc.check_magic(recv_exactly(sock, 4))
        sock.sendall(tc.encode_frame(message))
        decoder = tc.FrameDecoder()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("tracker closed the connection")
            messages = decoder.feed(data)
            if messages:
                return messages[0]


def tracker_request(address, key: str) -> list:
    """REQUEST a slot as TVM's client does; returns [host, port, matchkey] and never connects."""
    return _tracker_call(address, [tc.TrackerCode.REQUEST, key, "", 1])[1]


def tracker_free_slots(address, key: str) -> int:
    summary = _tracker_call(address, [tc.TrackerCode.SUMMARY])[1]
    return summary["queue_info"].get(key, {}).get("free", 0)


