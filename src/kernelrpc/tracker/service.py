"""The tracker's network layer: one asyncio event loop, one protocol object per connection.

Each connection opens with TVM's tracker magic and then carries JSON frames
(``kernelrpc.rpc.tracker_codec``).  Replies go out as one ``write`` of length and
JSON together, on sockets with TCP_NODELAY, so no reply waits for a delayed ACK.
All matching is done by :class:`~kernelrpc.tracker.scheduler.Scheduler`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import operator
import secrets
import socket
import time

from ..errors import ProtocolError
from ..rpc.tracker_codec import (
    MAGIC_BYTES,
    FrameDecoder,
    TrackerCode,
    encode_address_reply,
    encode_frame,
)
from . import messages
from .scheduler import UNMARKED, Match, Scheduler

log = logging.getLogger(__name__)

MAX_SLOTS_PER_CONNECTION = 4096
MAX_REQUESTS_PER_CONNECTION = 1024
MAX_SUMMARY_ROWS = 1000
READ_BUFFER_BYTES = 64 * 1024
OK_FRAME = encode_frame(TrackerCode.SUCCESS)
OPENING_TIMEOUT = 10.0
"""Seconds a new connection has to send the magic before it is closed."""


class TrackerConnection(asyncio.BufferedProtocol):
    """One peer: a server, a client, a status tool, or several of these at once.

    Reads go into the service's one receive buffer (``get_buffer``), not into a fresh
    256 KiB ``bytes`` per read as with ``asyncio.Protocol``: that allocation cost the
    tracker about as much CPU as all its other work per message.  Sharing is safe
    because every asyncio loop calls ``buffer_updated`` right after filling the buffer,
    and ``buffer_updated`` copies the bytes out before it returns.
    """

    def __init__(self, service: TrackerService) -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.host = ""
        self.name = "?"
        self.info: dict = {}
        self._opening = bytearray()
        self._opened = False
        self._decoder = FrameDecoder()
        self._opening_timer: asyncio.TimerHandle | None = None
        self._held: list[bytes] | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.host = str(peer[0])
        self.name = f"{peer[0]}:{peer[1]}"
        self.service.connections.add(self)
        self._opening_timer = asyncio.get_running_loop().call_later(OPENING_TIMEOUT, self._opening_timed_out)

    def _opening_timed_out(self) -> None:
        log.warning("%s sent no tracker magic within %.0f s; closing", self.name, OPENING_TIMEOUT)
        self.transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.service.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.service.read_buffer[:nbytes])

    def data_received(self, data) -> None:
        if not self._opened:
            self._opening += data
            if len(self._opening) < 4:
                return
            if bytes(self._opening[:4]) != MAGIC_BYTES:
                log.warning("%s is not a tracker peer (first bytes %s); closing",
                            self.name, bytes(self._opening[:4]).hex(" "))
                self.transport.close()
                return
            self._opened = True
            self._opening_timer.cancel()
            self.transport.write(MAGIC_BYTES)
            data = bytes(self._opening[4:])
            self._opening.clear()
        try:
            batch = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("%s: %s; closing", self.name, exc)
            self.send([TrackerCode.FAIL, str(exc)])
            self.transport.close()
            return
        if len(batch) < 2:
            for msg in batch:
                self.service.handle(self, msg)
            return
        self._held = []                 # several messages in one read: their replies in one write
        try:
            for msg in batch:
                self.service.handle(self, msg)
        finally:
            held, self._held = self._held, None
            if held:
                self.transport.write(b"".join(held))

    def write(self, frame: bytes) -> None:
        if self._held is None:
            self.transport.write(frame)
        else:
            self._held.append(frame)

    def send(self, obj) -> None:
        self.write(encode_frame(obj))

    @property
    def alive(self) -> bool:
        return not self.transport.is_closing()

    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        if self._opening_timer is not None:
            self._opening_timer.cancel()
        self.service.disconnected(self)

    @property
    def is_server(self) -> bool:
        key = self.info.get("key")
        return isinstance(key, str) and key.startswith("server")


class TrackerService:
    """State shared by all connections: the scheduler and the set of live peers."""

    def __init__(self, lease_timeout: float = 5.0, clock=time.monotonic) -> None:
        self.scheduler = Scheduler(lease_timeout=lease_timeout)
        self.connections: set[TrackerConnection] = set()
        self.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.stop_key = "tracker:" + secrets.token_hex(16)
        self.stopped = asyncio.Event()
        self._clock = clock
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._check_period = min(1.0, max(0.05, lease_timeout / 4))
        self._handlers = {messages.Request: self._on_request, messages.Put: self._on_put,
                          messages.UpdateInfo: self._on_update_info, messages.Simple: self._on_simple,
                          messages.Stop: self._on_stop}

    def start_timers(self) -> None:
        self._expiry_timer = asyncio.get_running_loop().call_later(self._check_period, self._check_leases)

    def _check_leases(self) -> None:
        self._deliver(self.scheduler.expire(self._clock()))
        self.start_timers()

    def stop(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        for conn in list(self.connections):
            conn.transport.close()
        self.stopped.set()

    # -- dispatch -------------------------------------------------------------------------

    def handle(self, conn: TrackerConnection, msg) -> None:
        """Run one message; every handler writes its own reply (REQUEST's may come later)."""
        try:
            cmd = messages.parse_message(msg)
            self._handlers[type(cmd)](conn, cmd)
        except ProtocolError as exc:
            log.warning("%s: bad tracker message %.200r: %s", conn.name, msg, exc)
            conn.send([TrackerCode.FAIL, str(exc)])

    def _on_request(self, conn: TrackerConnection, cmd: messages.Request) -> None:
        if self.scheduler.waiting_count(conn) >= MAX_REQUESTS_PER_CONNECTION:
            raise ProtocolError(f"more than {MAX_REQUESTS_PER_CONNECTION} waiting requests on one connection")
        matches = self.scheduler.request(conn, cmd.key, cmd.priority, self._clock(), protocol=cmd.user)
        if not matches and (others := self.scheduler.free_elsewhere(cmd.key, cmd.user)):
            log.info("%s waits for a %s server with key %r; free ones speak %s only (use separate keys)",
                     conn.name, cmd.user or UNMARKED, cmd.key, ", ".join(others))
        self._deliver(matches)

    def _on_put(self, conn: TrackerConnection, cmd: messages.Put) -> None:
        if self.scheduler.free_count(conn) >= MAX_SLOTS_PER_CONNECTION:
            raise ProtocolError(f"more than {MAX_SLOTS_PER_CONNECTION} free slots on one connection")
        host = cmd.custom_addr if cmd.custom_addr is not None else conn.host
        matches = self.scheduler.put(conn, cmd.key, host, cmd.port, cmd.matchkey, self._clock(),
                                     protocol=conn.info.get("protocol", ""))
        conn.write(OK_FRAME)
        self._deliver(matches)

    def _on_simple(self, conn: TrackerConnection, cmd: messages.Simple) -> None:
        if cmd.code == TrackerCode.PING:
            conn.write(OK_FRAME)
        elif cmd.code == TrackerCode.GET_PENDING_MATCHKEYS:
            conn.send(self.scheduler.pending_matchkeys(conn))
        else:
            conn.send([TrackerCode.SUCCESS, self.summary(self._clock())])

    def _on_stop(self, conn: TrackerConnection, cmd: messages.Stop) -> None:
        if cmd.stop_key != self.stop_key:
            conn.send(TrackerCode.FAIL)
            return
        conn.write(OK_FRAME)
        asyncio.get_running_loop().call_soon(self.stop)

    def _on_update_info(self, conn: TrackerConnection, cmd: messages.UpdateInfo) -> None:
        info = dict(cmd.info)
        if info["addr"][0] is None:
            info["addr"] = [conn.host, info["addr"][1]]
        merged = {**conn.info, **info}
        if len(json.dumps(merged)) > messages.MAX_INFO_BYTES:
            raise ProtocolError(f"a connection's info may hold at most {messages.MAX_INFO_BYTES} bytes")
        was_server = conn.is_server
        conn.info = merged
        if conn.is_server and not was_server:
            log.info("server %s registered from %s, address %s:%s", conn.info["key"], conn.name, *conn.info["addr"])
        if "session" in info:
            self.scheduler.reports_sessions(conn)
            if info["session"] == "active":
                self.scheduler.session_started(conn, self._clock())
        conn.write(OK_FRAME)

    def _deliver(self, matches: list[Match]) -> None:
        """Send each match to its client; a client that is already gone gives its slot back."""
        while matches:
            match = matches.pop(0)
            client: TrackerConnection = match.client
            if client.alive:
                slot = match.slot
                client.write(encode_address_reply(slot.host, slot.port, slot.matchkey))
                continue
            self.scheduler.drop_client(client)
            matches += self.scheduler.cancel(match, self._clock())

    def disconnected(self, conn: TrackerConnection) -> None:
        self.connections.discard(conn)
        self.scheduler.drop(conn, self._clock())
        if conn.is_server:
            log.info("server %s at %s:%s left", conn.info["key"], *conn.info["addr"])

    def summary(self, now: float) -> dict:
        """TVM's SUMMARY payload, plus free/pending per session protocol, leases, waiting
        requests and per-key statistics."""
        describe = operator.attrgetter("name")
        return {
            "queue_info": self.scheduler.queue_info(),
            "protocols": self.scheduler.protocol_info(),
            "server_info": [conn.info for conn in self.connections if conn.is_server],
            "leases": self.scheduler.lease_info(now, describe)[:MAX_SUMMARY_ROWS],
            "waiting": self.scheduler.wait_info(now, describe)[:MAX_SUMMARY_ROWS],
            "stats": self.scheduler.key_stats(),
        }



async def serve(sock: socket.socket, lease_timeout: float = 5.0, on_ready=None) -> None:
    """Serve tracker connections on the bound ``sock`` until STOP or cancellation."""
    service = TrackerService(lease_timeout=lease_timeout)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: TrackerConnection(service), sock=sock)
    service.start_timers()
    if on_ready is not None:
        on_ready(sock.getsockname())
    try:
        await service.stopped.wait()
    finally:
        server.close()
        service.stop()
