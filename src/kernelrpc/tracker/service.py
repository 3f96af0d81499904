"""The tracker's network layer: one asyncio event loop, one protocol object per connection.

Each connection opens with TVM's tracker magic (the opening machine of
``kernelrpc.wire.opening``: TLS, the magic, the auth challenge) and then carries JSON frames
(``kernelrpc.wire.tracker_codec``).  Replies go out as one ``write`` of length and
JSON together, on sockets with TCP_NODELAY, so no reply waits for a delayed ACK.
All matching is done by :class:`~kernelrpc.tracker.scheduler.Scheduler`.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import operator
import secrets
import socket
import ssl
import time

from ..acceptor import Acceptor, watch
from ..errors import ProtocolError
from ..wire.opening import (Accept, ConnectionClosed, DataReceived, OpeningConfig, OpeningMachine, Preamble,
                            Refusal, Reject, Send, TimerFired, TLSEstablished)
from ..wire.opening import State as OpeningState
from ..wire.tls import refuse_plaintext
from ..wire.tracker_codec import (
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
MAX_UNSERVED_REQUESTS_PER_CONNECTION = 16
"""Waiting requests one connection may hold for keys that no server has ever offered."""
MAX_UNSERVED_KEYS = 1024
"""Keys that no server has ever offered and that clients wait for, over all connections."""
MAX_SUMMARY_ROWS = 1000
SUMMARY_BUDGET = {"server_info": 320 << 10, "queue_info": 192 << 10, "protocols": 128 << 10,
                  "leases": 96 << 10, "waiting": 96 << 10, "stats": 96 << 10}
"""Bytes of JSON per SUMMARY section: together they stay below the 1 MiB frame limit."""
READ_BUFFER_BYTES = 64 * 1024
WRITE_BUFFER_BYTES = 256 * 1024
"""Unsent reply bytes per connection past which the tracker stops reading from it."""
HELD_REPLY_BYTES = 64 * 1024
"""Replies to one read are joined into one write, up to this many bytes at a time."""
OK_FRAME = encode_frame(TrackerCode.SUCCESS)
RECENT_MATCHES = 100
"""Matches the service remembers for the status page's recent sessions."""
OPENING_TIMEOUT = 10.0
"""Seconds a new connection has to send the magic before it is closed."""


@dataclasses.dataclass
class Limits:
    """What one peer may hold; the defaults are the CLI's."""

    opening_timeout: float = OPENING_TIMEOUT    # magic not received: closed
    frame_timeout: float = 30.0                 # a frame (or the magic) started and not finished: closed
    idle_timeout: float = 600.0                 # no message, and nothing held in the tracker: closed
    max_connections_per_host: int = 512         # past it, that host's longest-idle empty connection goes


_REFUSALS = {
    Refusal.TLS_UNEXPECTED: "%s speaks TLS, and this tracker runs without TLS (--tls-cert); closing%.0s",
    Refusal.BAD_PREAMBLE: "%s is not a tracker peer (%s); closing",
    Refusal.AUTH_FAILED: "%s does not know the auth token; closing%.0s",
}
"""How the tracker logs a refusal of a peer's opening (name, then the machine's detail)."""


class TrackerConnection(asyncio.BufferedProtocol):
    """One peer: a server, a client, a status tool, or several of these at once.

    Reads go into the service's one receive buffer (``get_buffer``), not into a fresh
    256 KiB ``bytes`` per read as with ``asyncio.Protocol``: that allocation cost the
    tracker about as much CPU as all its other work per message.  Sharing is safe
    because every asyncio loop calls ``buffer_updated`` right after filling the buffer,
    and ``buffer_updated`` copies the bytes out before it returns.
    """

    def __init__(self, service: TrackerService, opening: OpeningMachine | None = None) -> None:
        self.service = service
        self.transport: asyncio.Transport | None = None
        self.host = ""
        self.name = "?"
        self.info: dict = {}
        self.connected_at = self.last_message = self.partial_since = time.monotonic()
        self._opening: OpeningMachine | None = opening or OpeningMachine(service.opening, self.connected_at)
        self._decoder = FrameDecoder()
        self._held: list[bytes] | None = None
        self._held_bytes = 0
        self._inbox: collections.deque = collections.deque()
        self._write_paused = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.host = str(peer[0])
        self.name = f"{peer[0]}:{peer[1]}"
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        if self._opening.state is OpeningState.TLS:       # (TLSOpenings finished it)
            self._opening.handle(TLSEstablished(), self.connected_at)
        self.service.connected(self)

    def close(self, why: str) -> None:
        if not self.transport.is_closing():
            log.info("%s: %s; closing", self.name, why)
            self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.service.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.service.read_buffer[:nbytes])

    def data_received(self, data) -> None:
        if self._opening is not None:
            data = self._opened_with(bytes(data))
            if data is None:
                return
        had_partial = self._decoder.buffered
        try:
            batch = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("%s: %s; closing", self.name, exc)
            self.send([TrackerCode.FAIL, str(exc)])
            self.transport.close()
            return
        now = time.monotonic()
        if batch or not had_partial:
            self.partial_since = now
        if batch:
            self.last_message = now
        if not batch:
            return
        if len(batch) == 1 and not self._inbox and not self._write_paused:
            self.service.handle(self, batch[0])
            return
        self._inbox.extend(batch)
        self._run_inbox()

    def _opened_with(self, data: bytes) -> bytes | None:
        """Drive the opening machine (wire/opening.py) with ``data``: the bytes that follow the
        opening once the peer is accepted, else None."""
        for action in self._opening.handle(DataReceived(data), time.monotonic()):
            kind = type(action)
            if kind is Send:
                self.transport.write(action.data)
            elif kind is Accept:
                self._opening = None
                return action.leftover
            elif kind is Reject:
                self.transport.write(action.reply)
                log.warning(_REFUSALS[action.refusal], self.name, action.detail)
                self.transport.close()
        return None

    def _run_inbox(self) -> None:
        """Handle waiting messages until none is left or the peer stops taking its replies;
        the replies to the messages of one read go out together."""
        inbox = self._inbox
        self._held = []
        try:
            while inbox and not self._write_paused:
                self.service.handle(self, inbox.popleft())
                if self._held_bytes >= HELD_REPLY_BYTES:
                    self._flush_held()
        finally:
            self._flush_held()
            self._held = None

    def _flush_held(self) -> None:
        held = self._held
        if held:
            self._held = []
            self._held_bytes = 0
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write(self, frame: bytes) -> None:
        if self._held is None:
            self.transport.write(frame)
        else:
            self._held.append(frame)
            self._held_bytes += len(frame)

    def send(self, obj) -> None:
        self.write(encode_frame(obj))

    @property
    def alive(self) -> bool:
        return not self.transport.is_closing()

    def pause_writing(self) -> None:
        """The peer does not take its replies: read nothing more from it until it does."""
        self._write_paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._inbox:
            self._run_inbox()
        if not self._write_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self._inbox.clear()
        self.service.disconnected(self)

    def timed_out(self, now: float, limits: Limits) -> str | None:
        """Why the connection should be closed now, if it should."""
        if self._opening is not None:
            if self._opening.handle(TimerFired(), now):      # [Reject(TIMEOUT)] once it is due
                return f"sent no tracker magic within {limits.opening_timeout:g} s"
            return None
        if self._decoder.buffered and limits.frame_timeout and now - self.partial_since > limits.frame_timeout:
            return f"left a frame unfinished for {limits.frame_timeout:g} s"
        if limits.idle_timeout and now - self.last_message > limits.idle_timeout and self.idle:
            return f"sent nothing for {limits.idle_timeout:g} s and holds nothing"
        return None

    @property
    def idle(self) -> bool:
        """Holds nothing at the tracker: no server registration, slot, lease or waiting request."""
        return not self.is_server and not self.service.scheduler.holds(self) and not self._inbox

    @property
    def is_server(self) -> bool:
        key = self.info.get("key")
        return isinstance(key, str) and key.startswith("server")


class TrackerService:
    """State shared by all connections: the scheduler and the set of live peers."""

    def __init__(self, lease_timeout: float = 5.0, clock=time.monotonic, limits: Limits | None = None,
                 auth_token: bytes | None = None) -> None:
        self.auth_token = auth_token
        self.limits = limits or Limits()
        self.opening = OpeningConfig(Preamble.TRACKER, auth_token=auth_token, timeout=self.limits.opening_timeout)
        self.scheduler = Scheduler(lease_timeout=lease_timeout)
        self.connections: set[TrackerConnection] = set()
        self._by_host: dict[str, set[TrackerConnection]] = {}
        self.read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.stop_key = "tracker:" + secrets.token_hex(16)
        self.stopped = asyncio.Event()
        self._clock = clock
        self.started_at = clock()
        self.recent_matches: collections.deque = collections.deque(maxlen=RECENT_MATCHES)
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._check_period = min(1.0, max(0.05, lease_timeout / 4))
        timeouts = [t for t in (self.limits.opening_timeout, self.limits.frame_timeout, self.limits.idle_timeout) if t]
        self._sweep_period = min([1.0] + [max(0.05, t / 4) for t in timeouts])
        self._version = 0                   # changes whenever the state SUMMARY shows may have changed
        self._summary_cache: tuple[int, float, bytes] | None = None
        self._handlers = {messages.Request: self._on_request, messages.Put: self._on_put,
                          messages.UpdateInfo: self._on_update_info, messages.Simple: self._on_simple,
                          messages.Stop: self._on_stop}

    def now(self) -> float:
        """The clock the scheduler's times are on (for the status page)."""
        return self._clock()

    def start_timers(self) -> None:
        loop = asyncio.get_running_loop()
        self._expiry_timer = loop.call_later(self._check_period, self._check_leases)
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(self._sweep_period, self._sweep)

    def _check_leases(self) -> None:
        self._version += 1
        self._deliver(self.scheduler.expire(self._clock()))
        self.start_timers()

    def _sweep(self) -> None:
        """Close connections that stalled in the magic or in a frame, or idle ones that hold nothing."""
        now = time.monotonic()
        for conn in list(self.connections):
            why = conn.timed_out(now, self.limits)
            if why is not None:
                conn.close(why)
        self._sweep_timer = asyncio.get_running_loop().call_later(self._sweep_period, self._sweep)

    def stop(self) -> None:
        for timer in (self._expiry_timer, self._sweep_timer):
            if timer is not None:
                timer.cancel()
        for conn in list(self.connections):
            conn.transport.close()
        self.stopped.set()

    def connections_from(self, host: str) -> int:
        return len(self._by_host.get(host, ()))

    def connected(self, conn: TrackerConnection) -> None:
        """Admit a new connection; at its host's cap, the longest-idle connection that holds
        nothing makes room for it, or, if there is none, it is refused."""
        peers = self._by_host.setdefault(conn.host, set())
        if len(peers) >= self.limits.max_connections_per_host:
            idle = [c for c in peers if c.idle]
            if not idle:
                log.warning("refusing %s: %d connections from %s already hold slots or requests",
                            conn.name, len(peers), conn.host)
                conn.transport.abort()
                return
            victim = min(idle, key=operator.attrgetter("last_message"))
            victim.close(f"{len(peers)} connections from {conn.host}; making room for a new one")
            peers.discard(victim)           # its connection_lost comes later
        peers.add(conn)
        self.connections.add(conn)

    # -- dispatch -------------------------------------------------------------------------

    def handle(self, conn: TrackerConnection, msg) -> None:
        """Run one message; every handler writes its own reply (REQUEST's may come later)."""
        try:
            cmd = messages.parse_message(msg)
            if type(cmd) is not messages.Simple:
                self._version += 1
            self._handlers[type(cmd)](conn, cmd)
        except ProtocolError as exc:
            log.warning("%s: bad tracker message %.200r: %s", conn.name, msg, exc)
            conn.send([TrackerCode.FAIL, str(exc)])

    def _on_request(self, conn: TrackerConnection, cmd: messages.Request) -> None:
        scheduler = self.scheduler
        if scheduler.waiting_count(conn) >= MAX_REQUESTS_PER_CONNECTION:
            raise ProtocolError(f"more than {MAX_REQUESTS_PER_CONNECTION} waiting requests on one connection")
        if not scheduler.offered(cmd.key, cmd.user):
            if scheduler.unserved_count(conn) >= MAX_UNSERVED_REQUESTS_PER_CONNECTION:
                raise ProtocolError(f"more than {MAX_UNSERVED_REQUESTS_PER_CONNECTION} requests on one "
                                    "connection wait for keys that no server has offered")
            if scheduler.unserved_keys() >= MAX_UNSERVED_KEYS and not scheduler.has_queue(cmd.key, cmd.user):
                raise ProtocolError(f"{MAX_UNSERVED_KEYS} keys that no server has offered are waited for "
                                    f"already; no server has offered key {cmd.key!r}")
        matches = scheduler.request(conn, cmd.key, cmd.priority, self._clock(), protocol=cmd.user, host=conn.host)
        for eviction in scheduler.pop_evictions():
            eviction.client.send([TrackerCode.FAIL, eviction.message])
        if not matches and (others := scheduler.free_elsewhere(cmd.key, cmd.user)):
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
            conn.write(self.summary_frame(self._clock()))

    def _on_stop(self, conn: TrackerConnection, cmd: messages.Stop) -> None:
        if cmd.stop_key != self.stop_key:
            conn.send(TrackerCode.FAIL)
            return
        conn.write(OK_FRAME)
        asyncio.get_running_loop().call_soon(self.stop)

    def _on_update_info(self, conn: TrackerConnection, cmd: messages.UpdateInfo) -> None:
        info = dict(cmd.info)
        if cmd.unreachable is not None:
            self._on_unreachable(conn, cmd.unreachable)
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

    def _on_unreachable(self, conn: TrackerConnection, report: messages.Unreachable) -> None:
        server = self.scheduler.report_unreachable(report.key, report.matchkey, self._clock())
        if server is None:
            log.info("%s reports %s:%s for key %r unreachable, with a match key the tracker did not "
                     "hand out; ignored", conn.name, report.host, report.port, report.key)
            return
        log.warning("%s could not reach %s:%s, given out for key %r; the slots of %s are held back for %g s",
                    conn.name, report.host, report.port, report.key, getattr(server, "name", server),
                    self.scheduler.quarantine)

    def _deliver(self, matches: list[Match]) -> None:
        """Send each match to its client; a client that is already gone gives its slot back."""
        while matches:
            match = matches.pop(0)
            client: TrackerConnection = match.client
            if client.alive:
                slot = match.slot
                client.write(encode_address_reply(slot.host, slot.port, slot.matchkey))
                self.recent_matches.append((time.time(), match))
                continue
            self.scheduler.drop_client(client)
            matches += self.scheduler.cancel(match, self._clock())

    def disconnected(self, conn: TrackerConnection) -> None:
        self._version += 1
        self.connections.discard(conn)
        peers = self._by_host.get(conn.host)
        if peers is not None:
            peers.discard(conn)
            if not peers:
                del self._by_host[conn.host]
        self.scheduler.drop(conn, self._clock())
        if conn.is_server:
            log.info("server %s at %s:%s left", conn.info["key"], *conn.info["addr"])

    def summary_frame(self, now: float) -> bytes:
        """The SUMMARY reply, encoded once per state change (a flood of SUMMARY costs one build)."""
        cached = self._summary_cache
        if cached is not None and cached[0] == self._version and now - cached[1] < 1.0:
            return cached[2]
        frame = encode_frame([TrackerCode.SUCCESS, self.summary(now)])
        self._summary_cache = (self._version, now, frame)
        return frame

    def summary(self, now: float) -> dict:
        """TVM's SUMMARY payload, plus free/pending per session protocol, leases, waiting
        requests and per-key statistics.

        Each section is cut to its share of ``SUMMARY_BUDGET``, so the reply always fits in a
        frame a client can read; ``truncated`` then says how many rows each section left out.
        """
        describe = operator.attrgetter("name")
        scheduler = self.scheduler
        omitted: dict[str, int] = {}
        servers = [conn.info for conn in self.connections if conn.is_server]
        out = {
            "queue_info": dict(_within_budget(scheduler.queue_rows(), scheduler.key_count(), "queue_info", omitted)),
            "server_info": _within_budget(servers, len(servers), "server_info", omitted),
            "protocols": dict(_within_budget(scheduler.protocol_info().items(), scheduler.key_count(),
                                             "protocols", omitted)),
        }
        leases = scheduler.lease_info(now, describe, limit=MAX_SUMMARY_ROWS)
        out["leases"] = _within_budget(leases, scheduler.lease_count(), "leases", omitted)
        waiting, total_waiting = scheduler.wait_info(now, describe, limit=MAX_SUMMARY_ROWS)
        out["waiting"] = _within_budget(waiting, total_waiting, "waiting", omitted)
        stats = scheduler.key_stats(limit=MAX_SUMMARY_ROWS)
        out["stats"] = dict(_within_budget(stats.items(), scheduler.matched_key_count(), "stats", omitted))
        if omitted:
            out["truncated"] = omitted
        return out


_ROW_ENCODER = json.JSONEncoder()


def _within_budget(rows, total: int, section: str, omitted: dict) -> list:
    """The leading ``rows`` whose JSON fits in the section's budget; counts the rest in ``omitted``."""
    budget = SUMMARY_BUDGET[section]
    taken = []
    for row in rows:
        budget -= len(_ROW_ENCODER.encode(row)) + 2
        if budget < 0:
            break
        taken.append(row)
    if total > len(taken):
        omitted[section] = total - len(taken)
    return taken


def raise_open_file_limit(want: int = 65536) -> int:
    """Raise the soft descriptor limit towards the hard one (a flood of connections then
    meets the per-host cap, not EMFILE); returns the soft limit now in force."""
    try:
        import resource
    except ImportError:                 # not on this platform
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


async def serve(sock: socket.socket, lease_timeout: float = 5.0, on_ready=None, *,
                limits: Limits | None = None, backlog: int = 1024, on_service=None,
                auth_token: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
    """Serve tracker connections on the bound ``sock`` until STOP or cancellation;
    ``on_service(service)`` runs first (the status page attaches there). With ``tls`` (a
    server-side context) every connection is TLS (see :class:`TLSOpenings`)."""
    raise_open_file_limit()
    service = TrackerService(lease_timeout=lease_timeout, limits=limits, auth_token=auth_token)
    if on_service is not None:
        on_service(service)
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    sock.listen(backlog)
    starting: set[asyncio.Task] = set()
    openings = TLSOpenings(service, tls) if tls is not None else None

    def accepted(conn: socket.socket, addr) -> None:
        if openings is None:
            task = loop.create_task(loop.connect_accepted_socket(lambda: TrackerConnection(service), conn))
        else:
            task = openings.start(conn, addr)
            if task is None:
                return
        starting.add(task)
        task.add_done_callback(lambda t: _connection_started(t, conn, starting))

    # not loop.create_server: on EMFILE it pauses 1 s and logs a traceback at every retry
    stop_watching = watch(loop, Acceptor(sock), accepted)
    service.start_timers()
    if on_ready is not None:
        on_ready(sock.getsockname())
    try:
        await service.stopped.wait()
    finally:
        stop_watching()
        sock.close()
        for task in list(starting):
            task.cancel()
        service.stop()


def _connection_started(task: asyncio.Task, conn: socket.socket, starting: set) -> None:
    starting.discard(task)
    if task.cancelled():
        conn.close()
    elif isinstance(task.exception(), TLSOpeningFailed):
        log.warning("%s", task.exception())
        conn.close()
    elif task.exception() is not None:
        log.warning("cannot serve a new connection: %s", task.exception())
        conn.close()


class TLSOpeningFailed(Exception):
    """A connection that did not become a TLS tracker peer (the message says why)."""


class TLSOpenings:
    """TLS connections between ``accept`` and ``connection_made``, bounded like plain ones.

    A connection has ``opening_timeout`` in all for its first byte, the TLS handshake
    (asyncio's ``ssl_handshake_timeout`` gets what is left) and the magic: one opening machine
    (``wire/opening.py``) spans them, handed to its :class:`TrackerConnection`. It counts against its host's
    ``max_connections_per_host`` meanwhile: at the cap, the host's oldest unfinished opening
    makes room for the new one, so a flood of peers that never finish the handshake holds
    neither descriptors nor slots for long.  A first byte that cannot start a TLS hello
    (a plain-TCP peer) is answered with :data:`~kernelrpc.wire.tls.PLAINTEXT_REFUSAL`.
    """

    def __init__(self, service: TrackerService, context: ssl.SSLContext) -> None:
        self.service = service
        self.context = context
        self._by_host: dict[str, collections.OrderedDict[asyncio.Task, None]] = {}

    def start(self, conn: socket.socket, addr) -> asyncio.Task | None:
        host = str(addr[0])
        opening = self._by_host.setdefault(host, collections.OrderedDict())
        if len(opening) + self.service.connections_from(host) >= self.service.limits.max_connections_per_host:
            if not opening:
                log.warning("refusing %s:%s: %s has as many connections as it may", host, addr[1], host)
                conn.close()
                return None
            oldest = next(iter(opening))
            log.info("dropping the oldest unfinished TLS opening from %s: too many connections", host)
            oldest.cancel()
            del opening[oldest]
        task = asyncio.get_running_loop().create_task(self._open(conn, "%s:%s" % (host, addr[1])))
        opening[task] = None
        task.add_done_callback(lambda t: self._done(t, host))
        return task

    def _done(self, task: asyncio.Task, host: str) -> None:
        opening = self._by_host.get(host)
        if opening is not None:
            opening.pop(task, None)
            if not opening:
                del self._by_host[host]

    async def _open(self, conn: socket.socket, name: str) -> None:
        loop = asyncio.get_running_loop()
        opening = OpeningMachine(self.service.opening._replace(tls=True), time.monotonic())
        first = await _first_byte(loop, conn, opening.config.timeout)
        actions = opening.handle(DataReceived(first) if first else ConnectionClosed(), time.monotonic())
        if type(actions[0]) is Reject:
            if actions[0].refusal is Refusal.PLAINTEXT:
                log.warning("%s spoke plain TCP to this TLS tracker (%s); told it TLS is required",
                            name, actions[0].detail)
                refuse_plaintext(conn)
            else:
                log.info("%s: closed or sent nothing within %g s; closing", name, opening.config.timeout)
                conn.close()
            return
        try:           # StartTLS: the first byte is still in the socket, for the handshake
            await loop.connect_accepted_socket(lambda: TrackerConnection(self.service, opening), conn,
                                               ssl=self.context,
                                               ssl_handshake_timeout=max(0.01, opening.deadline - time.monotonic()))
        except (OSError, ssl.SSLError) as exc:
            raise TLSOpeningFailed(f"refusing {name}: the TLS handshake failed: {exc}") from None


async def _first_byte(loop, sock: socket.socket, timeout: float) -> bytes:
    """The first byte the peer sent, left in the socket (b"": it closed or sent nothing in time)."""
    readable = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, timeout)
    except asyncio.TimeoutError:
        return b""
    finally:
        loop.remove_reader(fd)
    try:
        return sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return b""
