"""The proxy service: accepts peers, pairs them by key, and keeps the tracker informed."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket

from ..errors import HandshakeError
from ..rpc.handshake import (RPC_CODE_DUPLICATE, RPC_CODE_MISMATCH, RPC_CODE_SUCCESS,
                             encode_reply, parse_key)
from .connection import PeerConnection
from .pairing import Matchmaker, Waiter

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 9090
    port_end: int = 9199
    tracker: tuple[str, int] | None = None
    timeout_client: float = 60.0
    timeout_server: float = 600.0
    handshake_timeout: float = 10.0
    max_connections: int = 4096
    max_waiting_per_key: int = 256


def _valid_matchkey(text: str) -> bool:
    return bool(text) and text.isprintable()


class ProxyService:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.matchmaker = Matchmaker(config.max_waiting_per_key)
        self.connections: set[PeerConnection] = set()
        self.tracker_link = None
        self._server: asyncio.base_events.Server | None = None
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await self._listen(loop)
        self.address = self._server.sockets[0].getsockname()[:2]
        if self.config.tracker:
            from .tracker_link import TrackerLink
            self.tracker_link = TrackerLink(self.config.tracker, self.address[1], self.matchmaker)
            self.tracker_link.start()
        return self.address

    async def _listen(self, loop):
        cfg = self.config
        ports = [0] if cfg.port == 0 else range(cfg.port, max(cfg.port_end, cfg.port + 1))
        last_error: OSError | None = None
        for port in ports:
            try:
                return await loop.create_server(lambda: PeerConnection(self), cfg.host, port,
                                                family=socket.AF_INET if ":" not in cfg.host else 0,
                                                reuse_address=True, backlog=512)
            except OSError as exc:
                last_error = exc
        raise OSError(f"no free port in [{cfg.port}, {cfg.port_end}) on {cfg.host}: {last_error}")

    async def close(self) -> None:
        if self.tracker_link is not None:
            await self.tracker_link.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()

    # -- called by PeerConnection -------------------------------------------
    def connection_opened(self, conn: PeerConnection) -> None:
        if len(self.connections) >= self.config.max_connections:
            conn.fail(f"too many connections (limit {self.config.max_connections})")
            return
        self.connections.add(conn)
        conn.timer = asyncio.get_running_loop().call_later(
            self.config.handshake_timeout, self._handshake_expired, conn)

    def _handshake_expired(self, conn: PeerConnection) -> None:
        if conn.waiter is None and conn.peer is None:
            conn.fail(f"no complete handshake within {self.config.handshake_timeout:g}s")

    def handshake_done(self, conn: PeerConnection, key: str) -> None:
        conn.timer.cancel()
        conn.timer = None
        parsed = parse_key(key)
        if not parsed.role or not _valid_matchkey(parsed.matchkey):
            logger.warning("rejecting %s: key %r is not 'client:<key>' or 'server:<key>'",
                           conn.name, key[:80])
            self._refuse(conn, RPC_CODE_MISMATCH)
            return
        if parsed.role == "server":
            waiter, outcome = self.matchmaker.add_device(conn, key, parsed.matchkey)
            timeout = self.config.timeout_server
        else:
            try:
                parsed.timeout
            except HandshakeError as exc:
                logger.warning("rejecting client %s: %s", conn.name, exc)
                self._refuse(conn, RPC_CODE_MISMATCH)
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
            conn.timer = asyncio.get_running_loop().call_later(timeout, self._wait_expired, conn)
            if waiter.is_device and self.tracker_link is not None:
                self.tracker_link.wake()
        elif outcome.action == "mismatch":
            logger.info("client %s asked for %r, a key that is gone: MISMATCH", conn.name,
                        parsed.matchkey)
            self._refuse(conn, RPC_CODE_MISMATCH)
        else:
            logger.warning("%s %s: %d peers already wait with key %r: DUPLICATE", role, conn.name,
                           self.config.max_waiting_per_key, parsed.matchkey)
            self._refuse(conn, RPC_CODE_DUPLICATE)

    def _wait_expired(self, conn: PeerConnection) -> None:
        conn.timer = None
        if self._forget(conn.waiter):
            logger.info("%s waited %s for key %r without a partner: MISMATCH",
                        conn.name, "too long", conn.waiter.wanted)
            self._refuse(conn, RPC_CODE_MISMATCH)

    def connection_closed(self, conn: PeerConnection, exc: Exception | None) -> None:
        self.connections.discard(conn)
        if self.release(conn):
            logger.info("%s %s left while waiting for key %r",
                        "device" if conn.waiter.is_device else "client", conn.name,
                        conn.waiter.wanted)

    def release(self, conn: PeerConnection) -> bool:
        """Take a closing connection out of the pools; True if it was still waiting."""
        return conn.waiter is not None and self._forget(conn.waiter)

    # -- internals ------------------------------------------------------------
    def _forget(self, waiter: Waiter) -> bool:
        offered = waiter.is_device and waiter.offered and waiter.claimed_at is None
        removed = self.matchmaker.remove(waiter)
        if removed and offered and self.tracker_link is not None:
            self.tracker_link.slot_went_stale()
        return removed

    def _pair(self, waiting: Waiter, newcomer: Waiter) -> None:
        a, b = waiting.handle, newcomer.handle
        if waiting.is_device and waiting.matchkey != newcomer.wanted and waiting.offered \
                and waiting.claimed_at is None and self.tracker_link is not None:
            self.tracker_link.slot_went_stale()
        if a.timer is not None:
            a.timer.cancel()
            a.timer = None
        a.start_relay(b)
        b.start_relay(a)
        a.send(encode_reply(RPC_CODE_SUCCESS, newcomer.key))
        b.send(encode_reply(RPC_CODE_SUCCESS, waiting.key))
        device, client = (waiting, newcomer) if waiting.is_device else (newcomer, waiting)
        logger.info("paired client %s (%r) with device %s (%r)", client.handle.name, client.key,
                    device.handle.name, device.key)

    @staticmethod
    def _refuse(conn: PeerConnection, code: int) -> None:
        conn.send(encode_reply(code))
        conn.close()
