"""The proxy service: accepts peers, pairs them by key, and keeps the tracker informed."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import socket

from ..acceptor import Acceptor, watch
from ..errors import HandshakeError
from ..netutil import bind_first_free
from ..wire import device_record
from ..wire.handshake import (RPC_CODE_DUPLICATE, RPC_CODE_MISMATCH, RPC_CODE_SUCCESS,
                              encode_reply, parse_key)
from ..wire.opening import OpeningConfig, Preamble
from ..wire.registration import OfferState
from ..wire.tls import TLSConfig
from ..runtime.threads import usable_cores
from . import relays
from . import websocket as ws
from .connection import PeerConnection, WebSocketConnection
from .pairing import Matchmaker, Waiter
from .relay import SessionRelay

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 9090
    port_end: int = 9199
    tracker: tuple[str, int] | None = None
    custom_addr: str | None = None  # the host the tracker hands to clients (default: as it sees us)
    timeout_client: float = 30.0
    timeout_server: float = 600.0
    handshake_timeout: float = 10.0
    max_connections: int = 4096
    max_waiting_per_key: int = 256
    web_port: int | None = None  # WebSocket endpoint ws://host:web_port/ws (0: OS chooses)
    relay: str = "auto"  # native where it runs, else splice; or "native" / "splice" / "copy"
    relay_spin_us: float = 50.0  # native relay: poll this long after traffic before sleeping
    auth_token: bytes | None = dataclasses.field(default=None, repr=False)  # --auth-token-file
    tls: TLSConfig | None = None  # TLS for peers (terminated here) and for the tracker link

    def __post_init__(self) -> None:
        if self.tls is not None and self.web_port is not None:
            raise ValueError("TLS and --web-port together are not supported: the WebSocket port "
                             "speaks ws:// only (put a TLS-terminating web server in front for wss://)")


def _valid_matchkey(text: str) -> bool:
    return bool(text) and text.isprintable()


class ProxyService:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.matchmaker = Matchmaker(config.max_waiting_per_key, promised=self._promised)
        self.connections: set[PeerConnection] = set()
        self.relays: set[SessionRelay] = set()
        self.tracker_link = None
        self._listener: socket.socket | None = None
        self._web_listener: socket.socket | None = None
        self._stop_watching: list = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls_context = None  # for accepting TLS peers, when the config has TLS
        self.address: tuple[str, int] | None = None
        self.relay_mode: str | None = None  # the relay in use, chosen by start()
        self.web_address: tuple[str, int] | None = None
        self.opening = OpeningConfig(Preamble.RPC, auth_token=config.auth_token, timeout=config.handshake_timeout)

    async def start(self) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        tls = self.config.tls
        self.relay_mode = relays.choose_relay(self.config.relay, tls=tls is not None)
        self._tls_context = tls.server_context() if tls is not None else None
        self._listener = self._bind()
        self.address = self._listener.getsockname()[:2]
        self._watch(self._listener, functools.partial(PeerConnection, tls=self._tls_context))
        if self.config.web_port is not None:
            ws.load_numpy()  # now, not in the middle of the first browser peer's upload
            port = self.config.web_port
            self._web_listener = bind_first_free(self.config.host, port, port + 1, backlog=512)
            self._web_listener.setblocking(False)
            self.web_address = self._web_listener.getsockname()[:2]
            self._watch(self._web_listener, WebSocketConnection)
        if self.config.tracker:
            from .tracker_link import TrackerLink
            self.tracker_link = TrackerLink(self.config.tracker, self.address[1], self.matchmaker,
                                            custom_addr=self.config.custom_addr,
                                            auth_token=self.config.auth_token,
                                            ssl_context=tls.client_context() if tls is not None else None)
            self.tracker_link.start()
        return self.address

    def describe_relay(self) -> str:
        """The relay in use, named first: ``native (...)``, ``splice (...)``, ``copy (TLS) (...)``..."""
        return relays.describe(self.relay_mode, self.config.relay_spin_us)

    def _bind(self) -> socket.socket:
        cfg = self.config
        sock = bind_first_free(cfg.host, cfg.port, cfg.port_end, backlog=512)
        sock.setblocking(False)
        return sock

    async def close(self) -> None:
        if self.tracker_link is not None:
            await self.tracker_link.close()
        for stop in self._stop_watching:
            stop()
        for listener in (self._listener, self._web_listener):
            if listener is not None:
                listener.close()
        for conn in list(self.connections):
            conn.close()
        relays = list(self.relays)
        for relay in relays:
            relay.close()
        for relay in relays:
            await relay.wait_closed()

    def _watch(self, listener: socket.socket, connection_type) -> None:
        def accepted(sock: socket.socket, addr) -> None:
            self._accepted(sock, addr, connection_type)
        self._stop_watching.append(watch(self._loop, Acceptor(listener), accepted))

    def _accepted(self, sock: socket.socket, addr, connection_type) -> None:
        if len(self.connections) + 2 * len(self.relays) >= self.config.max_connections:
            logger.warning("refusing %s:%s: %d connections is the limit", *addr[:2],
                           self.config.max_connections)
            sock.close()
            return
        conn = connection_type(self, sock, addr)
        self.connections.add(conn)
        conn.timer = self._loop.call_at(conn.opening.deadline, conn.opening_timer)

    # -- called by PeerConnection -------------------------------------------
    def handshake_done(self, conn: PeerConnection, key: str) -> None:
        conn.timer.cancel()
        conn.timer = None
        parsed = parse_key(key)
        if not parsed.role or not _valid_matchkey(parsed.matchkey):
            logger.warning("rejecting %s: key %r is not 'client:<key>' or 'server:<key>'",
                           conn.name, key[:80])
            conn.refuse(encode_reply(RPC_CODE_MISMATCH))
            return
        if parsed.role == "server":
            waiter, outcome = self.matchmaker.add_device(conn, key, parsed.matchkey)
            timeout = self.config.timeout_server
        else:
            try:
                parsed.timeout
            except HandshakeError as exc:
                logger.warning("rejecting client %s: %s", conn.name, exc)
                conn.refuse(encode_reply(RPC_CODE_MISMATCH))
                return
            waiter, outcome = self.matchmaker.add_client(conn, key, parsed.matchkey)
            timeout = self.config.timeout_client
        conn.waiter = waiter
        role = "device" if waiter.is_device else "client"
        if outcome.action == "pair":
            self._pair(outcome.partner, waiter)
        elif outcome.action == "wait":
            logger.info("%s %s waits for key %r%s", role, conn.name, parsed.matchkey,
                        f" (offered as {waiter.matchkey})" if waiter.is_device else "")
            conn.timer = self._loop.call_later(timeout, self._wait_expired, conn)
            if waiter.is_device and self.tracker_link is not None:
                self.tracker_link.device_waiting(waiter)
        elif outcome.action == "mismatch":
            logger.info("client %s asked for %r, a key that is gone: MISMATCH", conn.name,
                        parsed.matchkey)
            conn.refuse(encode_reply(RPC_CODE_MISMATCH))
        else:
            logger.warning("%s %s: %d peers already wait with key %r: DUPLICATE", role, conn.name,
                           self.config.max_waiting_per_key, parsed.matchkey)
            conn.refuse(encode_reply(RPC_CODE_DUPLICATE))

    def _wait_expired(self, conn: PeerConnection) -> None:
        conn.timer = None
        if self._forget(conn.waiter):
            logger.info("%s waited too long for key %r without a partner: MISMATCH",
                        conn.name, conn.waiter.wanted)
            conn.refuse(encode_reply(RPC_CODE_MISMATCH))

    def peer_left(self, conn: PeerConnection) -> None:
        if conn.waiter is not None and self._forget(conn.waiter):
            logger.info("%s %s left while waiting for key %r",
                        "device" if conn.waiter.is_device else "client", conn.name,
                        conn.waiter.wanted)

    def connection_closed(self, conn: PeerConnection) -> None:
        self.connections.discard(conn)
        if conn.waiter is not None:
            self._forget(conn.waiter)

    # -- internals ------------------------------------------------------------
    def _promised(self, device: Waiter) -> bool:
        return self.tracker_link is not None and self.tracker_link.offer_state(device) is OfferState.CLAIMED

    def _forget(self, waiter: Waiter) -> bool:
        """Take a waiter out of the pools; True if it was still waiting."""
        removed = self.matchmaker.remove(waiter)
        if removed and waiter.is_device and self.tracker_link is not None:
            self.tracker_link.device_gone(waiter)
        return removed

    def _make_relay(self, a: PeerConnection, b: PeerConnection, *, to_a: bytes, to_b: bytes,
                    on_close) -> SessionRelay:
        # Polling holds a core while a session is busy: only while cores are left for it.
        spinning = len(self.relays) < usable_cores()
        spin_ns = int(self.config.relay_spin_us * 1000) if spinning else 0
        return relays.open_relay(self.relay_mode, self._loop, a, b, to_a=to_a, to_b=to_b,
                                 on_close=on_close, spin_ns=spin_ns)

    def _pair(self, waiting: Waiter, newcomer: Waiter) -> None:
        a, b = waiting.handle, newcomer.handle
        if waiting.is_device and self.tracker_link is not None:
            self.tracker_link.device_gone(waiting, handed_out=waiting.matchkey == newcomer.wanted)
        try:
            relay = self._make_relay(a, b,
                                     to_a=encode_reply(RPC_CODE_SUCCESS, newcomer.key),
                                     to_b=encode_reply(RPC_CODE_SUCCESS, waiting.key),
                                     on_close=lambda: self.relays.discard(relay))
        except OSError as exc:  # no descriptors left for the pipes
            logger.error("cannot relay %s <-> %s: %s", a.name, b.name, exc)
            a.close()
            b.close()
            return
        for conn in (a, b):
            conn.hand_over()
            self.connections.discard(conn)
        self.relays.add(relay)
        relay.start()
        device, client = (waiting, newcomer) if waiting.is_device else (newcomer, waiting)
        logger.info("paired client %s (%r) with device %s (%r)", client.handle.name, client.key,
                    device.handle.name, device_record.shorten(device.key))
