"""Client side of the tracker: ask for a device by key, wait in its queue, get a session.

Works with kernelrpc's tracker and with Apache TVM's (same wire protocol).  The
API is synchronous, on blocking sockets, so it also works inside a running event
loop (Jupyter).  Time spent waiting in the queue (``timeout``) is kept apart from
the session's lifetime on the server (``session_timeout``).

Every REQUEST names our session protocol in the ``user`` field (TVM's clients send
``""``, TVM's tracker ignores it): kernelrpc's tracker then hands out only servers that
registered with the same protocol, never one of TVM's.
"""
from __future__ import annotations

import logging
import socket
import time

from ..errors import (ConnectionLost, ConnectTimeout, HandshakeError, ProtocolError, QueueTimeout,
                      TrackerError)
from .protocol import VERSION_STRING
from .tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode, check_magic, encode_frame

log = logging.getLogger(__name__)


class TrackerUnreachable(TrackerError):
    """No tracker answers at the address (refused, timed out, or the peer is not a tracker)."""


def connect_tracker(host: str, port: int, connect_timeout: float = 10.0) -> TrackerSession:
    """Open a session with the tracker at ``host:port``."""
    return TrackerSession((host, int(port)), connect_timeout=connect_timeout)


class TrackerSession:
    """A connection to a tracker: ``request`` a device, ``summary`` / ``text_summary`` its state."""

    def __init__(self, addr: tuple[str, int], connect_timeout: float = 10.0) -> None:
        self.addr = addr
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder()
        self._replies: list = []
        self._connect()

    @property
    def where(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.addr, timeout=self.connect_timeout)
        except socket.timeout:
            raise TrackerUnreachable(f"cannot reach tracker at {self.where}: connection timed out "
                                     f"after {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise TrackerUnreachable(f"cannot reach tracker at {self.where}: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(MAGIC_BYTES)
            echo = b""
            while len(echo) < 4:
                chunk = sock.recv(4 - len(echo))
                if not chunk:
                    break
                echo += chunk
            check_magic(echo)
        except (OSError, ProtocolError) as exc:
            sock.close()
            detail = "it did not answer" if isinstance(exc, socket.timeout) else str(exc)
            raise TrackerUnreachable(f"{self.where} is not a tracker: {detail}") from None
        sock.settimeout(None)
        self._sock = sock
        self._decoder = FrameDecoder()
        self._replies = []

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> TrackerSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # -- exchanges ------------------------------------------------------------------------

    def _send(self, msg) -> None:
        if self._sock is None:
            self._connect()
        self._sock.sendall(encode_frame(msg))

    def _recv(self, deadline: float | None = None):
        """The next reply; ``socket.timeout`` once ``deadline`` (monotonic) has passed."""
        while not self._replies:
            self._sock.settimeout(None if deadline is None else max(1e-3, deadline - time.monotonic()))
            data = self._sock.recv(65536)
            if not data:
                self.close()
                raise ConnectionLost(f"tracker {self.where} closed the connection")
            self._replies += self._decoder.feed(data)
        return self._replies.pop(0)

    def _call(self, msg):
        """Send ``msg`` (an idempotent query) and return the reply; a connection that broke
        since the last call (say, the tracker restarted) is reopened once."""
        for attempt in (1, 2):
            try:
                self._send(msg)
                reply = self._recv()
                break
            except (OSError, ConnectionLost) as exc:
                self.close()
                if attempt == 2:
                    raise ConnectionLost(f"lost the connection to tracker {self.where}: {exc}") from None
        _raise_for_failure(reply, self.where)
        return reply

    def ping(self) -> None:
        self._call([TrackerCode.PING])

    def summary(self) -> dict:
        """The tracker's state: ``queue_info`` (free/pending per key) and ``server_info``
        (kernelrpc's tracker adds ``protocols``, ``leases``, ``waiting`` and per-key ``stats``)."""
        reply = self._call([TrackerCode.SUMMARY])
        if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == TrackerCode.SUCCESS
                and isinstance(reply[1], dict)):
            raise TrackerError(f"tracker {self.where} answered SUMMARY with {reply!r:.200}")
        return reply[1]

    def text_summary(self) -> str:
        """The same text as TVM's ``TrackerSession.text_summary``."""
        return format_summary(self.summary())

    # -- requesting a device ----------------------------------------------------------------

    def request(self, key: str, priority: int = 1, session_timeout: float = 0, max_retry: int = 5,
                timeout: float | None = None):
        """Wait for a free server with ``key`` and open a session with it.

        ``timeout`` bounds the wait in the tracker's queue (QueueTimeout); ``session_timeout``
        is how long the server lets the session run.  A server that does not accept the
        match key (it went away or its key went stale) costs one of ``max_retry`` attempts.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        self._warn_if_unknown(key)
        last_error: Exception | None = None
        for attempt in range(1, max_retry + 1):
            try:
                host, port, matchkey = self._wait_for_match(key, priority, deadline, timeout)
            except (OSError, ConnectionLost) as exc:
                self.close()
                last_error = exc
                continue
            from .client import connect

            try:
                return connect(host, port, key=matchkey, session_timeout=session_timeout)
            except (HandshakeError, ConnectionLost, ConnectTimeout, OSError) as exc:
                log.info("server %s:%s for key %r did not accept the session (attempt %d of %d): %s",
                         host, port, key, attempt, max_retry, exc)
                last_error = exc
        raise TrackerError(f"no session for key {key!r} from tracker {self.where} after {max_retry} "
                           f"attempts; last error: {last_error}")

    def request_address(self, key: str, priority: int = 1, timeout: float | None = None) -> tuple[str, int, str]:
        """Wait in the queue and return ``(host, port, matchkey)`` without connecting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait_for_match(key, priority, deadline, timeout)

    def _wait_for_match(self, key: str, priority: int, deadline: float | None, timeout: float | None):
        self._send([TrackerCode.REQUEST, key, VERSION_STRING, priority])
        try:
            reply = self._recv(deadline)
        except socket.timeout:
            self.close()                      # closing the connection takes us out of the queue
            raise QueueTimeout(f"no server with key {key!r} became free within {timeout:g} s at tracker "
                               f"{self.where}{self._queue_state(key)}") from None
        _raise_for_failure(reply, self.where)
        try:
            code, (host, port, matchkey) = reply
            if code != TrackerCode.SUCCESS or not isinstance(host, str) or not isinstance(matchkey, str):
                raise ValueError
            return host, int(port), matchkey
        except (TypeError, ValueError):
            raise TrackerError(f"tracker {self.where} answered REQUEST with {reply!r:.200}") from None

    def _queue_state(self, key: str) -> str:
        """A few words on why the wait was long, from a fresh summary; empty if unavailable."""
        try:
            with TrackerSession(self.addr, connect_timeout=2.0) as probe:
                info = probe.summary()
        except (TrackerError, ConnectionLost, OSError):
            return ""
        servers = count_servers(info).get(key, 0)
        queue = info.get("queue_info", {}).get(key, {})
        return f" ({servers} servers have this key, {queue.get('free', 0)} free, {queue.get('pending', 0)} waiting)"

    def _warn_if_unknown(self, key: str) -> None:
        info = self.summary()
        servers = [item for item in info.get("server_info", []) if key in served_keys(item)]
        if not servers:
            if "protocols" in info:            # kernelrpc's tracker: free slots per session protocol
                free = info["protocols"].get(key, {}).get(VERSION_STRING, {}).get("free", 0)
            else:
                free = info.get("queue_info", {}).get(key, {}).get("free", 0)
            if not free:
                log.warning("no server with key %r is registered at tracker %s (keys with servers: %s); "
                            "the request waits until one registers", key, self.where,
                            ", ".join(sorted(count_servers(info))) or "none")
        elif not any(_is_proxy(item) or item.get("protocol") == VERSION_STRING for item in servers):
            log.warning("the servers with key %r at tracker %s are not kernelrpc servers (%s); %s. Give "
                        "TVM's and kernelrpc's servers different keys", key, self.where,
                        ", ".join(sorted({str(item.get("protocol", "TVM's")) for item in servers})),
                        "the request waits for a kernelrpc server" if "protocols" in info else
                        "this tracker cannot tell them apart and may hand one out")


def _raise_for_failure(reply, where: str) -> None:
    if reply == TrackerCode.FAIL:
        raise TrackerError(f"tracker {where} refused the request")
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == TrackerCode.FAIL:
        raise TrackerError(f"tracker {where} refused the request: {reply[1]}")


def _is_proxy(item: dict) -> bool:
    return str(item.get("key", "")).startswith("server:proxy[")


def served_keys(item: dict) -> list[str]:
    """The device keys a ``server_info`` entry serves: ``server:KEY`` (KEY may hold ':',
    like ``127.0.0.1:5555``) or a proxy's ``server:proxy[K1,K2]``."""
    key = str(item.get("key", ""))
    if not key.startswith("server:"):
        return []
    if _is_proxy(item) and key.endswith("]"):
        return [k for k in key[len("server:proxy["):-1].split(",") if k]
    return [key[len("server:"):]]


def count_servers(info: dict) -> dict[str, int]:
    """Servers (and proxies) per device key.  TVM's ``text_summary`` counts ``key.split(":")[1]``,
    which loses keys holding ':' and counts a proxy under ``proxy[K]``, a key nobody requests."""
    total: dict[str, int] = {}
    for item in info.get("server_info", []):
        for key in served_keys(item):
            total[key] = total.get(key, 0) + 1
    return total


def format_summary(info: dict) -> str:
    """Render a SUMMARY payload exactly like TVM's ``text_summary`` (``tvm-rpc-protocol.md`` 2.8)."""
    lines = ["Server List", "-" * 30, "server-address           key", "-" * 30]
    for item in sorted(info.get("server_info", []), key=lambda x: str(x.get("key", ""))):
        address = ":".join(map(str, item.get("addr", [])))
        lines.append(f"{address:21s}    {item.get('key', '')}")
    lines += ["-" * 30, ""]
    total = count_servers(info)
    queue_info = info.get("queue_info", {})
    keys = sorted(queue_info)
    width = max((len(k) for k in keys), default=0)
    title = f"{'key':<{width}s}   total  free  pending"
    rule = "-" * (len(title) + 1)
    lines += ["Queue Status", rule, title, rule]
    for k in keys:
        count, free, pending = total.get(k, 0), queue_info[k]["free"], queue_info[k]["pending"]
        if count or pending:
            lines.append(f"{k:<{width}}   {count:<5d}  {free:<4d}  {pending:<7d}")
    lines.append(rule)
    return "\n".join(lines) + "\n"
