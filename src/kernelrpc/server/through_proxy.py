"""The device server's outbound mode: connect out to a proxy and serve the clients it pairs.

``python -m kernelrpc.server --through-proxy --host PROXY --port PORT --key KEY`` (TVM's
flags).  The loop (TVM's, ``docs/tvm-wire-formats.md`` section 4.3):

1. connect to the proxy and send the preamble with
   ``server:KEY -protocol=kernelrpc/1 -device=RECORD`` (TVM's proxy takes the first word; ours
   tells its tracker which clients may have us and what the device is,
   :mod:`kernelrpc.wire.device_record`);
2. wait until the proxy pairs us: it answers SUCCESS and the client's full key, whose
   ``-timeout=`` option limits the session;
3. serve the session in a child process, exactly as for a direct connection (a spare, forked
   and warmed up while the link waits: :mod:`.spare`);
4. connect again.

A MISMATCH means the proxy gave up waiting for a client (its ``--timeout-server``):
reconnect at once.  Refused or lost connections (the proxy restarts) are retried with
jittered exponential backoff (:class:`kernelrpc.wire.backoff.Backoff`), forever; TVM's
server gives up after five failures.  A peer that is not a proxy is not retried:
:class:`NotAProxy` says what answered instead (a device server answers MISMATCH to a
``server:`` key at once; other services send no RPC magic).  TCP keepalive notices a
proxy that vanished without closing and keeps NAT mappings open while the device waits.

With ``--tls-ca`` (the server's TLS configuration) the link to the proxy is TLS, the
proxy's certificate checked against ``--host``; the session then runs behind a TLS
relay (:mod:`.tls_relay`) as a direct TLS session does.
"""
from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

from ..errors import AuthenticationError, ConnectionLost, HandshakeError, ProtocolError, RPCError
from ..netutil import enable_keepalive, receive_until
from ..wire import device_record
from ..wire import handshake as H
from ..wire.auth import authenticate
from ..wire.backoff import Backoff
from ..wire.protocol import VERSION_STRING
from .config import ServerConfig
from ..wire.tls import check_plaintext_answer, describe_failure, wrap_client
from ..runtime import device_info
from .spare import WARM_UP_WAIT, Spares
from .tls_relay import LINGER, start_tls_session

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
MIN_BACKOFF = 0.5
MAX_BACKOFF = 30.0
QUICK_REFUSAL = 0.5
"""A MISMATCH sooner than this after our key went out is no proxy timeout (those are whole
seconds): the peer is a device server, or a proxy that refuses our key; retrying cannot help."""


SILENT_CLOSES = 3
"""Connections in a row closed at once without a word: a tracker, or another non-proxy."""


class NotAProxy(HandshakeError):
    """The address given as the proxy's answers as something else; retrying cannot help."""


def wait_for_pairing(sock: socket.socket, initial: bytes = b"") -> tuple[H.Reply, bytes]:
    """Block until the proxy answers; returns the reply and any session bytes after it."""
    parser = H.ReplyParser()
    return receive_until(sock, parser, "the proxy", "the wait for a client", initial), parser.unused


class ProxyLink:
    """One outbound connection at a time; ``serve_one`` returns after one wait or session."""

    def __init__(self, config: ServerConfig, announce=print) -> None:
        self.config = config
        self.proxy = (config.host, config.port)
        self._announce = announce
        self._announced = False
        self._silent_closes = 0
        self._tls = config.tls.client_context() if config.tls is not None else None
        self.key = (f"{H.make_key('server', config.key)} -protocol={VERSION_STRING}"
                    + device_record.key_option(device_info.describe()))
        self.spares = Spares(config, blocking=True)

    def close(self) -> None:
        """End the spare session child (the server stops)."""
        self.spares.close()

    def _check_not_refused(self, sock: socket.socket, where: str) -> None:
        """A TLS proxy answers a plain device with TLS_REQUIRED (see :mod:`kernelrpc.wire.tls`)."""
        if self._tls is None:
            check_plaintext_answer(sock, f"proxy {where}")

    def serve_one(self) -> bool:
        """Wait for one client and serve it. False when the proxy ended the wait (MISMATCH)."""
        where = "%s:%d" % self.proxy
        self.spares.check()
        self.spares.fill()      # warms up while we wait for a client
        sock = socket.create_connection(self.proxy, timeout=CONNECT_TIMEOUT)
        try:
            enable_keepalive(sock)
            if self._tls is not None:
                sock = wrap_client(sock, self._tls, self.proxy[0], f"proxy {where}")
            waiting_since = time.monotonic()      # before the proxy can start its timeout
            key = self.key
            sock.sendall(H.encode_preamble(key))
            after_auth = b""
            if self.config.auth_token is not None:   # bounded by the connect timeout still set
                self._check_not_refused(sock, where)
                after_auth = authenticate(sock, self.config.auth_token, key.encode(), f"proxy {where}")
            sock.settimeout(None)
            log.info("connected to proxy %s; waiting for a client with key %r", where, self.config.key)
            if not self._announced:
                self._announce(f"kernelrpc.server connected to proxy {where} with key "
                               f"{self.config.key}", flush=True)
                self._announced = True
            try:
                if self.config.auth_token is None:
                    self._check_not_refused(sock, where)  # the proxy's first bytes: the pairing reply
                reply, initial = wait_for_pairing(sock, after_auth)
            except ProtocolError as exc:
                raise NotAProxy(f"{where} is not a proxy: {exc}") from None
            except ConnectionLost as exc:
                if isinstance(exc.__cause__, ssl.SSLError):   # the proxy refused our certificate
                    raise describe_failure(exc.__cause__, f"proxy {where}") from None
                quick = time.monotonic() - waiting_since < QUICK_REFUSAL
                self._silent_closes = self._silent_closes + 1 if quick else 0
                if self._silent_closes >= SILENT_CLOSES:
                    raise NotAProxy(f"{where} closed {SILENT_CLOSES} connections in a row without answering "
                                    f"'server:{self.config.key}': it is not a proxy (a tracker?)"
                                    + ("" if self._tls else ", or a proxy that takes TLS peers only "
                                       "(give this server --tls-ca)")) from None
                raise
            self._silent_closes = 0
            if reply.code == H.RPC_CODE_MISMATCH:
                if time.monotonic() - waiting_since < QUICK_REFUSAL:
                    raise NotAProxy(
                        f"{where} answered MISMATCH at once to 'server:{self.config.key}': it is a device "
                        f"server, not a proxy (is the proxy listening on another port?), or a proxy "
                        f"that refuses this key")
                log.info("proxy %s ended the wait (no client within its timeout); reconnecting", where)
                return False
            reply.raise_for_code(f"proxy {where}")
            client_key = H.parse_key(reply.key)
            client_key.timeout  # validates -timeout= before anything is forked
            log.info("proxy %s paired us with %r", where, reply.key)
            relay = None
            self.spares.wait_warm(WARM_UP_WAIT)
            if self._tls is not None:
                session, relay = start_tls_session(sock, client_key, self.config, initial, f"proxy {where}",
                                                   start=self.spares.start)
            else:
                session = self.spares.start(sock, client_key, self.config, initial)
            sock = None  # the session owns it now
            try:
                session.wait(ending=self.spares.fill)   # the next spare warms up while this child exits
            finally:
                try:
                    session.kill()  # on SIGTERM (SystemExit) mid-session
                except ChildProcessError:
                    pass  # already reaped when the session expired
                if relay is not None:
                    relay.reap(LINGER + 1.0)    # it delivers the session's last notice first
            return True
        finally:
            if sock is not None:
                sock.close()


def serve_through_proxy(config: ServerConfig, stop: threading.Event | None = None) -> None:
    """Serve clients through the proxy at ``config.host:config.port`` until ``stop`` is set."""
    if not config.key:
        raise HandshakeError("--through-proxy needs --key: the proxy pairs clients by key")
    stop = stop or threading.Event()
    link = ProxyLink(config)
    backoff = Backoff(MIN_BACKOFF, MAX_BACKOFF)
    try:
        while not stop.is_set():
            try:
                link.serve_one()
                backoff.reset()
                continue
            except NotAProxy:
                raise
            except (OSError, RPCError) as exc:
                if isinstance(exc, (HandshakeError, ProtocolError, AuthenticationError)):
                    log.error("proxy %s:%d refused us: %s", *link.proxy, exc)
                else:
                    log.warning("proxy %s:%d unreachable or gone: %s", *link.proxy, exc)
            delay = backoff.next()
            log.info("reconnecting to the proxy in %.1fs", delay)
            stop.wait(delay)
    finally:
        link.close()
