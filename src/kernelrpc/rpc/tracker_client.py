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

import _socket          # see _open_connection
import os
import time

from ..errors import (AuthenticationError, ConnectionLost, ConnectTimeout, HandshakeError, ProtocolError, QueueTimeout,
                      ServerCrashed, SessionTimeout, TrackerError)
from ..lazylog import LazyLogger
from ..wire.tracker_codec import MAGIC_BYTES, Code, FrameDecoder, check_magic, encode_frame

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl

    from ..wire.tls import TLSConfig

log = LazyLogger(__name__)

#: While a request waits in the queue, how often its place is looked up for the progress bar
#: and ``on_queue_wait`` (seconds; nothing is looked up for a request granted sooner).
QUEUE_POLL_S = 1.0


class TrackerUnreachable(TrackerError):
    """No tracker answers at the address (refused, timed out, or the peer is not a tracker)."""


class TrackerNotListening(TrackerUnreachable):
    """Nothing accepts connections at the address (refused, unreachable, or timed out); a
    peer that accepts and is no tracker is the parent class."""


def connect_tracker(host: str, port: int, connect_timeout: float = 10.0, *,
                    auth_token: bytes | str | None = None,
                    tls: TLSConfig | ssl.SSLContext | None = None) -> TrackerSession:
    """Open a session with the tracker at ``host:port``.

    ``auth_token`` (default: ``$KERNELRPC_AUTH_TOKEN`` or the file ``$KERNELRPC_AUTH_TOKEN_FILE``)
    authenticates to a tracker started with ``--auth-token-file``, and to the servers it hands out.
    ``tls`` (a :class:`~kernelrpc.wire.tls.TLSConfig` or an ``ssl.SSLContext``; default: from
    ``$KERNELRPC_TLS_*``, else plain TCP) is used for the tracker and for the servers it hands out.
    """
    return TrackerSession((host, int(port)), connect_timeout=connect_timeout, auth_token=auth_token, tls=tls)


class TrackerSession:
    """A connection to a tracker: ``request`` a device, ``summary`` / ``text_summary`` its state."""

    def __init__(self, addr: tuple[str, int], connect_timeout: float = 10.0, *,
                 auth_token: bytes | str | None = None,
                 tls: TLSConfig | ssl.SSLContext | None = None) -> None:
        self.addr = addr
        self._auth_token = _resolve_token(auth_token)
        self._tls = _client_context(tls)
        self.connect_timeout = connect_timeout
        self._sock: _socket.socket | None = None
        self._decoder = FrameDecoder()
        self._replies: list = []
        #: A progress bar while a request waits: None = where someone watches, True/False.
        self.progress: bool | None = None
        #: Called with a ``tracker_summary.QueueState`` every QUEUE_POLL_S while a request waits.
        self.on_queue_wait = None
        self._connect()

    def __repr__(self) -> str:
        return f"<TrackerSession {self.where} {'connected' if self._sock else 'closed'}>"

    @property
    def where(self) -> str:
        return f"{self.addr[0]}:{self.addr[1]}"

    def _connect(self) -> None:
        try:
            sock = _open_connection(self.addr, self.connect_timeout)
        except _socket.timeout:
            raise TrackerNotListening(f"cannot reach tracker at {self.where}: connection timed out "
                                     f"after {self.connect_timeout:g} s") from None
        except OSError as exc:
            raise TrackerNotListening(f"cannot reach tracker at {self.where}: {exc.strerror or exc}") from None
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        where = f"tracker {self.where}"
        try:
            if self._tls is not None:
                from ..wire.tls import wrap_client

                sock = wrap_client(sock, self._tls, self.addr[0], where)
            sock.sendall(MAGIC_BYTES)
            echo = b""
            if self._auth_token is not None:
                from ..wire.auth import AUTH_CONTEXT, authenticate

                if self._tls is None:     # a TLS tracker's refusal, which is no challenge
                    from ..wire.tls import check_plaintext_answer

                    check_plaintext_answer(sock, where)
                echo = authenticate(sock, self._auth_token, AUTH_CONTEXT, where)
            while len(echo) < 4:
                chunk = sock.recv(4 - len(echo))
                if not chunk:
                    break
                echo += chunk
            if echo != MAGIC_BYTES:
                self._refused(echo[:4], where)
        except (AuthenticationError, HandshakeError):    # TLSError is a HandshakeError
            sock.close()
            raise
        except (OSError, ProtocolError) as exc:
            sock.close()
            if self._tls is not None:
                from ..wire.tls import describe_failure, is_ssl_error, refused_after_handshake

                if is_ssl_error(exc):        # a mutual-TLS refusal arrives on the first read
                    raise describe_failure(exc, where) from None
                if isinstance(exc, ConnectionResetError):
                    raise refused_after_handshake(where) from None
            detail = "it did not answer" if isinstance(exc, _socket.timeout) else str(exc)
            raise TrackerUnreachable(f"{self.where} is not a tracker: {detail}") from None
        sock.settimeout(None)
        self._sock = sock
        self._decoder = FrameDecoder()
        self._replies = []

    def _refused(self, echo: bytes, where: str) -> None:
        """Raise what the peer's answer to the magic (not the magic) means."""
        from ..wire.auth import CHALLENGE_HEAD, refusal_for_unauthenticated
        from ..wire.tls import PLAINTEXT_REFUSAL, refused_after_handshake, requires_tls

        if not echo and self._tls is not None:
            raise refused_after_handshake(where)
        if echo == PLAINTEXT_REFUSAL and self._tls is None:
            raise requires_tls(where)
        if echo == CHALLENGE_HEAD:
            raise refusal_for_unauthenticated(where)
        check_magic(echo)

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
        self._call([Code.PING])

    def summary(self) -> dict:
        """The tracker's state: ``queue_info`` (free/pending per key) and ``server_info``
        (kernelrpc's tracker adds ``protocols``, ``leases``, ``waiting`` and per-key ``stats``)."""
        reply = self._call([Code.SUMMARY])
        if not (isinstance(reply, list) and len(reply) == 2 and reply[0] == Code.SUCCESS
                and isinstance(reply[1], dict)):
            raise TrackerError(f"tracker {self.where} answered SUMMARY with {reply!r:.200}")
        return reply[1]

    def text_summary(self) -> str:
        """The same text as TVM's ``TrackerSession.text_summary``."""
        return format_summary(self.summary())

    def summary_table(self):
        """The summary as tables (queues, servers and who holds them, waiting requests) that
        print as text and render as HTML in Jupyter; ``.info`` is the dict."""
        from .tracker_summary import TrackerSummary

        return TrackerSummary(self.summary(), self.where)

    # -- requesting a device ----------------------------------------------------------------

    def request(self, key: str, priority: int = 1, session_timeout: float = 0, max_retry: int = 5,
                timeout: float | None = None, *, connect_timeout: float = 5.0, handshake_timeout: float = 10.0,
                reconnect_timeout: float = 30.0):
        """Wait for a free server with ``key`` and open a session with it.

        ``timeout`` bounds the wait in the tracker's queue (QueueTimeout); ``session_timeout``
        is how long the server lets the session run.  ``connect_timeout`` and
        ``handshake_timeout`` bound the TCP connect to the server and its handshake.  A server
        that cannot be reached (refused, timed out, closed) is reported to the tracker, which
        hands it to nobody for a while, and the next one is tried; a server that refuses the
        match key (it went stale) is just skipped.  Each costs one of ``max_retry`` attempts.
        If the tracker connection breaks while waiting (say, the tracker restarts), the request
        reconnects and queues again, until ``timeout`` or, without one, ``reconnect_timeout``.
        """
        from .client import connect

        deadline = None if timeout is None else time.monotonic() + timeout
        self._warn_if_unknown(key)
        last_error: Exception | None = None
        for attempt in range(1, max_retry + 1):
            host, port, matchkey = self._wait_for_match(key, priority, deadline, timeout, reconnect_timeout)
            try:
                return connect(host, port, matchkey, session_timeout, connect_timeout=connect_timeout,
                               handshake_timeout=handshake_timeout, auth_token=self._auth_token, tls=self._tls)
            except (HandshakeError, ConnectionLost, ConnectTimeout, OSError) as exc:
                log.info("server %s:%s for key %r did not accept the session (attempt %d of %d): %s",
                         host, port, key, attempt, max_retry, exc)
                last_error = exc
                if not isinstance(exc, HandshakeError):
                    self._report_unreachable(key, host, port, matchkey)
        raise TrackerError(f"no session for key {key!r} from tracker {self.where} after {max_retry} "
                           f"attempts; last error: {last_error}")

    def request_and_run(self, key: str, func, priority: int = 1, session_timeout: float = 0,
                        max_retry: int = 2):
        """TVM's ``request_and_run``: request a session for ``key``, return ``func(remote)``.

        A failure of the device or of the connection (``ConnectionLost``, ``ServerCrashed``,
        a refused handshake, a tracker error) costs one of ``max_retry`` attempts, each with a
        new session; a ``SessionTimeout`` is raised at once (a longer run would time out
        again), and so are errors of ``func`` itself, ``RemoteError`` included (the kernel or
        the arguments are at fault, not the board). The session is closed when ``func``
        returns, so its result must not be a remote object.
        """
        last_error: Exception | None = None
        for attempt in range(1, max_retry + 1):
            try:
                with self.request(key, priority=priority, session_timeout=session_timeout) as remote:
                    return func(remote)
            except SessionTimeout:
                raise
            except (ConnectionLost, ServerCrashed, HandshakeError, ConnectTimeout, TrackerError) as exc:
                log.info("request_and_run(%r, %s): attempt %d of %d failed: %s", key,
                         getattr(func, "__name__", func), attempt, max_retry, exc)
                last_error = exc
        raise TrackerError(f"request_and_run: {getattr(func, '__name__', 'func')} failed on key "
                           f"{key!r} {max_retry} times; last error: {last_error}") from last_error

    def request_address(self, key: str, priority: int = 1, timeout: float | None = None,
                        reconnect_timeout: float = 30.0) -> tuple[str, int, str]:
        """Wait in the queue and return ``(host, port, matchkey)`` without connecting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait_for_match(key, priority, deadline, timeout, reconnect_timeout)

    def _report_unreachable(self, key: str, host: str, port: int, matchkey: str) -> None:
        """Tell the tracker (best effort) that the server it handed out cannot be reached.  Sent
        in an UPDATE_INFO that TVM's tracker merges into our info and otherwise ignores."""
        report = {"key": key, "addr": [host, port], "matchkey": matchkey}
        try:
            self._call([Code.UPDATE_INFO, {"addr": [None, 0], "unreachable": report}])
        except (TrackerError, ConnectionLost, OSError) as exc:
            log.debug("could not report %s:%s to tracker %s: %s", host, port, self.where, exc)

    def _wait_for_match(self, key: str, priority: int, deadline: float | None, timeout: float | None,
                        reconnect_timeout: float):
        from ..wire.backoff import Backoff
        from ..wire.version import VERSION_STRING

        lost_at = None
        backoff = Backoff(0.05, 1.0, jitter=0.5)
        while True:
            try:
                self._send([Code.REQUEST, key, VERSION_STRING, priority])
                reply = self._await_match(key, deadline)
                break
            except _socket.timeout:
                self.close()                      # closing the connection takes us out of the queue
                raise QueueTimeout(f"no server with key {key!r} became free within {timeout:g} s at tracker "
                                   f"{self.where}{self._queue_state(key)}") from None
            except (OSError, ConnectionLost, TrackerUnreachable) as exc:
                self.close()
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    log.warning("lost tracker %s while waiting for key %r (%s); reconnecting", self.where, key, exc)
                give_up = deadline if deadline is not None else lost_at + reconnect_timeout
                if now >= give_up:
                    raise TrackerUnreachable(f"lost tracker {self.where} while waiting for key {key!r} and "
                                             f"could not queue again within {give_up - lost_at:.3g} s: {exc}") from None
                time.sleep(min(backoff.next(), give_up - now))
        _raise_for_failure(reply, self.where)
        try:
            code, (host, port, matchkey) = reply
            if code != Code.SUCCESS or not isinstance(host, str) or not isinstance(matchkey, str):
                raise ValueError
            return host, int(port), matchkey
        except (TypeError, ValueError):
            raise TrackerError(f"tracker {self.where} answered REQUEST with {reply!r:.200}") from None

    def _await_match(self, key: str, deadline: float | None):
        """The REQUEST's reply. While it is not there, every QUEUE_POLL_S the request's place in
        the queue goes to ``on_queue_wait`` and to a progress bar (display.progress)."""
        from ..display import progress, progress_enabled

        watch = progress_enabled(self.progress)
        if not watch and self.on_queue_wait is None:
            return self._recv(deadline)
        bar = None
        try:
            while True:
                step = time.monotonic() + QUEUE_POLL_S
                try:
                    return self._recv(step if deadline is None else min(step, deadline))
                except _socket.timeout:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise
                state = self.queue_state(key)
                if state is None:
                    continue
                if self.on_queue_wait is not None:
                    self.on_queue_wait(state)
                if watch:
                    bar = bar or progress(desc=f"waiting for {key!r}", unit="poll", enabled=True)
                    bar.set_postfix_str(str(state))
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()

    def queue_state(self, key: str):
        """Where this session's request for ``key`` stands (a ``QueueState``), from a fresh
        summary on a second connection; None when the tracker cannot tell."""
        from .tracker_summary import queue_state

        try:
            client = "{}:{}".format(*self._sock.getsockname()[:2])
            with TrackerSession(self.addr, connect_timeout=2.0) as probe:
                return queue_state(probe.summary(), key, client)
        except (TrackerError, ConnectionLost, OSError, AttributeError):
            return None

    def _queue_state(self, key: str) -> str:
        """A few words on why the wait was long, from a fresh summary; empty if unavailable."""
        try:
            with TrackerSession(self.addr, connect_timeout=2.0) as probe:
                info = probe.summary()
        except (TrackerError, ConnectionLost, OSError):
            return ""
        counts = count_servers(info)
        if not counts.get(key):
            return f" (no server has this key; keys with servers: {', '.join(sorted(counts)) or 'none'})"
        queue = info.get("queue_info", {}).get(key, {})
        return (f" ({counts[key]} servers have this key, {queue.get('free', 0)} free, "
                f"{queue.get('pending', 0)} waiting)")

    def _warn_if_unknown(self, key: str) -> None:
        """Best effort: a request never depends on the summary (a tracker may refuse it)."""
        from ..wire.version import VERSION_STRING

        try:
            info = self.summary()
        except (TrackerError, ConnectionLost, OSError) as exc:
            log.debug("no summary from tracker %s: %s", self.where, exc)
            return
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


def printable(text) -> str:
    """``str(text)`` with control and other unprintable characters escaped (safe on a terminal)."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _raise_for_failure(reply, where: str) -> None:
    if reply == Code.FAIL:
        raise TrackerError(f"tracker {where} refused the request")
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == Code.FAIL:
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
    """Render a SUMMARY payload exactly like TVM's ``text_summary`` (``docs/tvm-wire-formats.md`` section 2.8)."""
    lines = ["Server List", "-" * 30, "server-address           key", "-" * 30]
    for item in sorted(info.get("server_info", []), key=lambda x: str(x.get("key", ""))):
        address = printable(":".join(map(str, item.get("addr", []))))
        lines.append(f"{address:21s}    {printable(item.get('key', ''))}")
    lines += ["-" * 30, ""]
    total = count_servers(info)
    queue_info = info.get("queue_info", {})
    keys = sorted(queue_info)
    width = max((len(printable(k)) for k in keys), default=0)
    title = f"{'key':<{width}s}   total  free  pending"
    rule = "-" * (len(title) + 1)
    lines += ["Queue Status", rule, title, rule]
    for k in keys:
        count, free, pending = total.get(k, 0), queue_info[k]["free"], queue_info[k]["pending"]
        if count or pending:
            lines.append(f"{printable(k):<{width}}   {count:<5d}  {free:<4d}  {pending:<7d}")
    lines.append(rule)
    truncated = info.get("truncated")
    if isinstance(truncated, dict) and truncated:
        lines.append("(the tracker left out " + ", ".join(f"{n} {printable(part)} rows" for part, n in
                                                      sorted(truncated.items())) + " to fit its reply)")
    return "\n".join(lines) + "\n"


#: What ``auth.resolve_token`` and ``tls.TLSConfig.from_env`` read. Where none of them is set,
#: and no token or TLS is given, neither module is loaded: ``wire.tls`` imports ``socket``, and a
#: token loads ``hashlib``; tests/test_runtime_imports.py checks that the names agree.
AUTH_ENVIRONMENT = ("KERNELRPC_AUTH_TOKEN", "KERNELRPC_AUTH_TOKEN_FILE")
TLS_ENVIRONMENT = ("KERNELRPC_TLS_CA", "KERNELRPC_TLS_CERT", "KERNELRPC_TLS_KEY")


def _resolve_token(auth_token: bytes | str | None) -> bytes | None:
    """``auth.resolve_token(auth_token)``."""
    if auth_token is None and not any(os.environ.get(name) for name in AUTH_ENVIRONMENT):
        return None
    from ..wire.auth import resolve_token

    return resolve_token(auth_token)


def _client_context(tls: TLSConfig | ssl.SSLContext | None) -> ssl.SSLContext | None:
    """``tls.client_context(tls)``."""
    if tls is None and not any(os.environ.get(name) for name in TLS_ENVIRONMENT):
        return None
    from ..wire.tls import client_context

    return client_context(tls)


def _open_connection(addr: tuple[str, int], timeout: float | None) -> _socket.socket:
    """``socket.create_connection(addr, timeout)``, on ``_socket``, the C module ``socket`` wraps.

    The sockets and the errors are the same, but ``import socket`` costs more than the rest of a
    first ``connect_tracker()`` (its enums load ``enum``; it loads ``selectors``). A host name in
    ASCII goes to ``getaddrinfo`` as bytes: as a str it would load the ``idna`` codec (with
    ``unicodedata``), even for "localhost" or "127.0.0.1".
    """
    host, port = addr
    name = host.encode() if isinstance(host, str) and host.isascii() else host
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"no address for {host}")
