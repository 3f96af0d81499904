"""A device server's link to its tracker, driven by the server's own selectors loop.

The loop calls :meth:`TrackerRegistration.tick` whenever ``time.monotonic()``
reaches :meth:`next_deadline`; every socket operation here is non-blocking, so a
slow or dead tracker never holds up the server.  The sequence follows TVM's
``rpc_server --tracker`` (``docs/tvm-wire-formats.md`` section 2.6), so it works with TVM's
tracker as well as ours:

1. connect, send the magic alone and wait for its echo;
2. UPDATE_INFO ``{"key": "server:<key>", "addr": [custom_addr, port]}`` then PUT
   ``[3, key, [port, matchkey], custom_addr]``;
3. every ``poll_interval`` send GET_PENDING_MATCHKEYS; when the current match
   key has been missing for ``MISSES_BEFORE_ROTATE`` polls (a client took it and
   never came), offer a fresh one;
4. when a session starts, retire the match key; when it ends, offer a fresh one;
5. on any error, close and reconnect with exponential backoff, so servers come
   back by themselves after a tracker restart.

Our UPDATE_INFO also carries ``"session": "idle" | "active"``; kernelrpc's tracker
uses it to withdraw a busy server and to expire leases whose client never came
(TVM's tracker just lists it in SUMMARY). ``"device"`` describes the board
(:func:`kernelrpc.runtime.device_info.describe`: architecture, CPU, the target string
to build for it); trackers list it in SUMMARY's ``server_info``.  Its ``"protocol"`` names our session
protocol, so that kernelrpc's tracker hands this server only to kernelrpc clients.
"""
from __future__ import annotations

import errno
import logging
import os
import random
import secrets
import select
import socket
import time

from ..errors import AuthenticationError, ProtocolError
from ..runtime import device_info
from ..rpc.protocol import VERSION_STRING
from ..rpc.auth import AUTH_CONTEXT, CHALLENGE_HEAD, PeerAuth, refusal_for_unauthenticated
from ..rpc.tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode, check_magic, encode_frame

log = logging.getLogger(__name__)

MISSES_BEFORE_ROTATE = 4
"""TVM's rule: ``misses * 2 > 4 + 2`` with a 2 s poll, i.e. four polls in a row."""


class TrackerRegistration:
    """Keeps one server registered at a tracker under ``key``; see the module docstring."""

    BACKOFF_MIN = 0.25
    BACKOFF_MAX = 10.0
    CONNECT_TIMEOUT = 5.0
    REPLY_TIMEOUT = 10.0
    IO_POLL = 0.005

    def __init__(self, tracker_addr: tuple[str, int], key: str, port: int,
                 custom_addr: str | None = None, *, poll_interval: float = 2.0,
                 auth_token: bytes | None = None) -> None:
        self._auth_token = auth_token
        self._auth: PeerAuth | None = None
        self.tracker_addr = (tracker_addr[0], int(tracker_addr[1]))
        self.key = key
        self.port = int(port)
        self.custom_addr = custom_addr
        self.poll_interval = poll_interval
        self.matchkey: str | None = None
        self.registered = False
        self._sock: socket.socket | None = None
        self._state = "disconnected"
        self._decoder = FrameDecoder()
        self._echo = b""
        self._expect: list[str] = []      # what each outstanding reply answers, in order
        self._waiting_since = 0.0
        self._state_deadline = 0.0
        self._retry_at = time.monotonic()
        self._backoff = self.BACKOFF_MIN
        self._next_poll = 0.0
        self._misses = 0
        self._busy = False
        self._failures = 0
        self._last_warning = -1e9
        self._closed = False
        self._last_tick = 0.0
        self.device = device_info.describe()

    @property
    def where(self) -> str:
        return f"{self.tracker_addr[0]}:{self.tracker_addr[1]}"

    # -- loop interface ---------------------------------------------------------------------

    def next_deadline(self) -> float:
        if self._closed:
            return time.monotonic() + 3600
        if self._state == "disconnected":
            return self._retry_at
        if self._state != "ready" or self._expect:
            return self._last_tick + self.IO_POLL
        return self._next_poll

    def tick(self) -> None:
        if self._closed:
            return
        now = self._last_tick = time.monotonic()
        try:
            if self._state == "disconnected":
                if now >= self._retry_at:
                    self._start_connect(now)
            elif self._state == "connecting":
                self._check_connected(now)
            elif self._state == "opening":
                self._read_echo(now)
            else:
                self._read_replies(now)
                if not self._expect and now >= self._next_poll:
                    self._send([TrackerCode.GET_PENDING_MATCHKEYS], "pending", now)
        except (OSError, ProtocolError, AuthenticationError) as exc:
            self._fail(str(exc) or type(exc).__name__, now)

    def session_started(self) -> None:
        """The current match key was used: retire it until the session ends."""
        self._busy = True
        self._misses = 0
        self.matchkey = self._fresh_matchkey()
        if self._state == "ready":
            self._guarded(lambda now: self._send([TrackerCode.UPDATE_INFO, self._info("active")], "info", now))

    def session_finished(self) -> None:
        """Offer the server again, with a match key never used before."""
        self._busy = False
        self._misses = 0
        self.matchkey = self._fresh_matchkey()
        if self._state == "ready":
            self._guarded(self._offer_idle)

    def close(self) -> None:
        self._closed = True
        self._close_socket()

    # -- connection -----------------------------------------------------------------------

    def _start_connect(self, now: float) -> None:
        family = socket.AF_INET6 if ":" in self.tracker_addr[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._state = "connecting"
        self._state_deadline = now + self.CONNECT_TIMEOUT
        err = sock.connect_ex(self.tracker_addr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            raise OSError(err, f"cannot connect: {errno.errorcode.get(err, err)}")
        self._check_connected(now)

    def _check_connected(self, now: float) -> None:
        _, writable, _ = select.select([], [self._sock], [], 0)
        if not writable:
            if now > self._state_deadline:
                raise OSError(errno.ETIMEDOUT, f"connection timed out after {self.CONNECT_TIMEOUT:g} s")
            return
        err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        self._sock.send(MAGIC_BYTES)            # alone: TVM's tracker wants it in its own segment
        self._state = "opening"
        self._echo = b""
        if self._auth_token is not None:
            self._auth = PeerAuth(self._auth_token, AUTH_CONTEXT, f"tracker {self.where}")
        self._state_deadline = now + self.REPLY_TIMEOUT

    def _read_echo(self, now: float) -> None:
        data = self._recv()
        if data is None:
            if now > self._state_deadline:
                raise OSError(errno.ETIMEDOUT, "the tracker did not answer the magic")
            return
        if self._auth is not None and not self._auth.done:
            step = self._auth.feed(data)
            if isinstance(step, bytes):
                self._sock.sendall(step)    # 64 bytes into an empty send buffer
            if step is not True:
                return
            data = self._auth.unused
        elif (self._echo + data)[:4] == CHALLENGE_HEAD:
            raise refusal_for_unauthenticated(f"tracker {self.where}")
        self._echo += data
        if len(self._echo) < 4:
            return
        try:
            check_magic(self._echo[:4])
        except ProtocolError as exc:
            raise ProtocolError(f"{self.where} is not a tracker: {exc}") from None
        self._state = "ready"
        self._decoder = FrameDecoder()
        self._expect = []
        self.matchkey = self._fresh_matchkey()
        self._send([TrackerCode.UPDATE_INFO, self._info("active" if self._busy else "idle", with_device=True)],
                   "info", now)
        if not self._busy:
            self._offer(now)
        if self._echo[4:]:
            self._handle_bytes(self._echo[4:], now)

    def _recv(self) -> bytes | None:
        try:
            data = self._sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            raise OSError(errno.ECONNRESET, "the tracker closed the connection")
        return data

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _fail(self, reason: str, now: float) -> None:
        was_registered = self.registered
        self._close_socket()
        self._state = "disconnected"
        self.registered = False
        self._expect = []
        delay = self._backoff * random.uniform(0.8, 1.2)
        self._retry_at = now + delay
        self._backoff = min(self.BACKOFF_MAX, self._backoff * 2)
        self._failures += 1
        if was_registered:
            log.warning("lost the connection to tracker %s (%s); reconnecting in %.1f s", self.where, reason, delay)
        elif self._failures == 1 or now - self._last_warning >= 30:
            log.warning("cannot reach tracker %s (%s); retrying in %.1f s", self.where, reason, delay)
            self._last_warning = now
        else:
            log.debug("cannot reach tracker %s (%s); retrying in %.1f s", self.where, reason, delay)

    def _guarded(self, action) -> None:
        now = time.monotonic()
        try:
            action(now)
        except OSError as exc:
            self._fail(str(exc), now)

    # -- messages -------------------------------------------------------------------------

    def _info(self, session: str, *, with_device: bool = False) -> dict:
        info = {"key": "server:" + self.key, "addr": [self.custom_addr, self.port], "session": session,
                "protocol": VERSION_STRING}
        if with_device:        # once per connection: trackers merge later updates into it
            info["device"] = self.device
        return info

    def _offer_idle(self, now: float) -> None:
        self._send([TrackerCode.UPDATE_INFO, self._info("idle")], "info", now)
        self._offer(now)

    def _offer(self, now: float) -> None:
        self._send([TrackerCode.PUT, self.key, [self.port, self.matchkey], self.custom_addr], "put", now)

    def _send(self, msg, expect: str, now: float) -> None:
        self._sock.sendall(encode_frame(msg))
        if not self._expect:
            self._waiting_since = now
        self._expect.append(expect)

    def _read_replies(self, now: float) -> None:
        while self._expect:
            data = self._recv()
            if data is None:
                if now - self._waiting_since > self.REPLY_TIMEOUT:
                    raise OSError(errno.ETIMEDOUT, f"no reply from the tracker in {self.REPLY_TIMEOUT:g} s")
                return
            self._handle_bytes(data, now)

    def _handle_bytes(self, data: bytes, now: float) -> None:
        for reply in self._decoder.feed(data):
            if not self._expect:
                raise ProtocolError(f"unexpected message from the tracker: {reply!r:.100}")
            self._handle_reply(self._expect.pop(0), reply, now)
            self._waiting_since = now

    def _handle_reply(self, what: str, reply, now: float) -> None:
        if what == "pending":
            if not isinstance(reply, list):
                raise ProtocolError(f"GET_PENDING_MATCHKEYS answered {reply!r:.100}")
            self._next_poll = now + self.poll_interval
            self._after_poll(reply, now)
            return
        if reply != TrackerCode.SUCCESS:
            raise ProtocolError(f"the tracker refused {what.upper()}: {reply!r:.200}")
        if not self.registered and not self._expect:
            self.registered = True
            self._backoff = self.BACKOFF_MIN
            self._failures = 0
            self._next_poll = now + self.poll_interval
            advertised = self.custom_addr or self._sock.getsockname()[0]
            log.info("registered key %s at tracker %s, advertised %s:%d", self.key, self.where, advertised, self.port)

    def _after_poll(self, pending: list, now: float) -> None:
        if self._busy or self.matchkey in pending:
            self._misses = 0
            return
        self._misses += 1
        if self._misses >= MISSES_BEFORE_ROTATE:
            log.info("match key for %s was taken but no client came; offering a fresh one", self.key)
            self._misses = 0
            self.matchkey = self._fresh_matchkey()
            self._offer(now)

    def _fresh_matchkey(self) -> str:
        """``<key>:<64 random bits>``: never one used before, for all practical purposes."""
        return f"{self.key}:{secrets.token_hex(8)}"
