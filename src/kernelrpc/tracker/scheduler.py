"""The tracker's matching logic, free of IO and clocks.

One queue per device key: free slots in FIFO order (a server goes to the back
after each session, so a fleet is used round robin) and waiting requests ordered
by priority, then arrival.  Every call takes ``now`` from the caller and returns
the matches it made; the service layer turns them into replies.

Peers are opaque hashable handles (the service uses its connection objects): one
connection may both offer slots (a server) and wait for them (a client).

What this adds to TVM's ``PriorityScheduler`` (``docs/tvm-wire-formats.md`` section 2.5):

* a client that goes away leaves its queue at once (TVM keeps counting it in
  ``pending`` until a slot is offered to it);
* a server that goes away takes all its free slots with it, whether or not it
  sent UPDATE_INFO (TVM keeps handing out such stale slots);
* a handed-out slot becomes a *lease*.  A lease ends when the server offers a slot
  on the same port again (its session ended or it rotated its match key) or goes
  away.  For servers that report their sessions (``reports_sessions``), a lease
  whose client never arrives expires after ``lease_timeout`` and the slot goes
  back to the pool; other servers rotate their match key themselves (TVM's rule),
  so their old key is never handed out again;
* a server that reports a running session has its free slots withdrawn until it
  offers a new one, so a busy server is never handed out;
* queue wait (request to match) and session time (match to the server's next
  offer) are measured separately;
* a client that cannot reach the server it was handed reports it with that
  slot's match key (which only it knows); the server's slots are then held
  back for ``quarantine`` seconds, so no other client is sent there meanwhile;
* a queue for a key that no server ever offered goes away with its last
  waiting request, so made-up keys do not pile up;
* within a priority, connections take turns: a request's place is its rank among its
  connection's waiting requests, then arrival, so one connection that queues many requests
  delays another connection's request by at most one session (TVM serves pure FIFO);
* the waiting requests of one host (all local processes share 127.0.0.1) are bounded
  (``max_requests_per_host``) and shared fairly: at the bound, a request from a connection
  that holds fewer than the host's heaviest connection takes the place of that
  connection's oldest request, which is told why (``evictions``); the heaviest cannot
  add more.  The service caps each connection below the host's bound, so no single
  connection can shut out the others;
* a request is matched only with a slot of the same session ``protocol`` (kernelrpc's
  peers mark themselves, TVM's send nothing, ``""``), so TVM and kernelrpc clients can
  share a tracker and a key without being handed a server they cannot talk to.  A queue
  is therefore one per ``(key, protocol)``; summaries add the protocols up per key.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import operator
from typing import Hashable

from ..errors import ProtocolError

Peer = Hashable
QueueId = tuple  # (key, protocol)

UNMARKED = "tvm"
"""How summaries name the protocol of peers that do not mark theirs: TVM's."""
MAX_HINTED_PROTOCOLS = 16


@dataclasses.dataclass(eq=False, slots=True)
class Slot:
    """One session a server offers: ``[host, port, matchkey]`` is what the client receives."""

    server: Peer
    key: str
    host: str
    port: object  # int, or a numeric string from TVM's C++ server; echoed back unchanged
    matchkey: str
    offered_at: float
    protocol: str = ""

    @property
    def address(self) -> list:
        return [self.host, self.port, self.matchkey]


@dataclasses.dataclass(eq=False, slots=True)
class Request:
    client: Peer
    key: str
    priority: int
    seq: int
    requested_at: float
    cancelled: bool = False
    protocol: str = ""


@dataclasses.dataclass(eq=False, slots=True)
class Lease:
    """A slot handed to a client; lives until the server offers that port again."""

    slot: Slot
    request: Request
    granted_at: float
    expires_at: float | None
    in_session: bool = False

    @property
    def queue_wait(self) -> float:
        return self.granted_at - self.request.requested_at


@dataclasses.dataclass(slots=True)
class Match:
    client: Peer
    slot: Slot
    queue_wait: float


@dataclasses.dataclass
class KeyStats:
    """Counters per device key, kept for the lifetime of the tracker."""

    matches: int = 0
    queue_wait_total: float = 0.0
    queue_wait_max: float = 0.0
    sessions: int = 0
    session_total: float = 0.0
    expired_leases: int = 0

    def __add__(self, other: KeyStats) -> KeyStats:
        total = KeyStats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))
        total.queue_wait_max = max(self.queue_wait_max, other.queue_wait_max)
        return total

    def to_dict(self) -> dict:
        return {
            "matches": self.matches,
            "queue_wait_mean": self.queue_wait_total / self.matches if self.matches else 0.0,
            "queue_wait_max": self.queue_wait_max,
            "sessions": self.sessions,
            "session_mean": self.session_total / self.sessions if self.sessions else 0.0,
            "expired_leases": self.expired_leases,
        }


@dataclasses.dataclass(slots=True)
class Eviction:
    """A waiting request dropped to make room for another connection's, and why."""

    client: Peer
    key: str
    message: str


class _Queue:
    """Free slots (FIFO) and waiting requests (heap of ``(-priority, rank, seq)``) for one key."""

    def __init__(self) -> None:
        self.free: collections.OrderedDict[int, Slot] = collections.OrderedDict()
        self.waiting: list[tuple[int, int, int, Request]] = []
        self.live_requests = 0
        self.offered = False             # some server has offered a slot for this key
        self.stats = KeyStats()

    def best_request(self) -> Request | None:
        while self.waiting:
            request = self.waiting[0][-1]
            if not request.cancelled:
                return request
            heapq.heappop(self.waiting)
        return None

    @property
    def idle(self) -> bool:
        return not self.free and self.live_requests == 0


class Scheduler:
    """Matches requests to free slots, per key; see the module docstring for the rules."""

    def __init__(self, lease_timeout: float = 5.0, max_keys: int = 10_000,
                 max_leases_per_server: int = 4096, quarantine: float = 60.0,
                 max_requests_per_host: int = 4096) -> None:
        self.lease_timeout = lease_timeout
        self.max_requests_per_host = max_requests_per_host
        self.evictions: list[Eviction] = []                   # for the service to tell their clients
        self._host_of: dict[Peer, object] = {}                # client with waiting requests -> host
        self._waiting_on: dict[object, dict[Peer, None]] = {}  # host -> its clients with waiting requests
        self._waiting_per_host: collections.Counter = collections.Counter()
        self.quarantine = quarantine
        self.max_keys = max_keys
        self.max_leases_per_server = max_leases_per_server
        self._queues: dict[QueueId, _Queue] = {}
        self._seq = itertools.count()
        self._slots_of: dict[Peer, dict[str, Slot]] = {}      # server -> matchkey -> free slot
        self._requests_of: dict[Peer, list[Request]] = {}     # client -> its waiting requests
        self._leases_of: dict[Peer, list[Lease]] = {}         # server -> its open leases
        self._reporting: set[Peer] = set()
        self._quarantined: dict[Peer, float] = {}             # server -> when its slots return
        self._unserved: set[QueueId] = set()                  # queues never offered
        self._protocols: dict[str, None] = {}                # protocols servers offered, for hints

    # -- queues ---------------------------------------------------------------------------

    def _queue(self, key: str, protocol: str) -> _Queue:
        qid = (key, protocol)
        queue = self._queues.get(qid)
        if queue is None:
            if len(self._queues) >= self.max_keys:
                self._forget_idle_queues()
            queue = self._queues[qid] = _Queue()
            self._unserved.add(qid)
        return queue

    def _delete_queue(self, qid: QueueId) -> None:
        del self._queues[qid]
        self._unserved.discard(qid)

    def _forget_idle_queues(self) -> None:
        """Keys stay listed like in TVM's tracker, until there are too many of them."""
        for key in [k for k, q in self._queues.items() if q.idle and not q.stats.matches]:
            self._delete_queue(key)
        if len(self._queues) >= self.max_keys:
            for key in [k for k, q in self._queues.items() if q.idle]:
                self._delete_queue(key)

    def _schedule(self, queue: _Queue, now: float) -> list[Match]:
        matches = []
        while queue.free and queue.live_requests:
            request = queue.best_request()
            heapq.heappop(queue.waiting)
            queue.live_requests -= 1
            self._forget_request(request)
            _, slot = queue.free.popitem(last=False)
            matches.append(self._grant(queue, slot, request, now))
        return matches

    def _grant(self, queue: _Queue, slot: Slot, request: Request, now: float) -> Match:
        """Lease ``slot`` (already off the free list) to ``request`` (already off the waiting list)."""
        self._discard_free(slot)
        server = slot.server
        lease = Lease(slot, request, now, now + self.lease_timeout if server in self._reporting else None)
        leases = self._leases_of.get(server)
        if leases is None:
            self._leases_of[server] = [lease]
        else:
            leases.append(lease)
            if len(leases) > self.max_leases_per_server:
                del leases[0]
        wait = now - request.requested_at
        stats = queue.stats
        stats.matches += 1
        stats.queue_wait_total += wait
        stats.queue_wait_max = max(stats.queue_wait_max, wait)
        return Match(request.client, slot, wait)

    def _discard_free(self, slot: Slot) -> None:
        """Forget ``slot`` in its server's index (the caller removes it from the queue)."""
        slots = self._slots_of.get(slot.server)
        if slots is not None and slots.get(slot.matchkey) is slot:
            del slots[slot.matchkey]
            if not slots:
                del self._slots_of[slot.server]

    def _end_leases(self, server: Peer, now: float, port=None) -> None:
        leases = self._leases_of.get(server)
        if not leases:
            return
        keep = []
        for lease in leases:
            if port is not None and lease.slot.port != port:
                keep.append(lease)
                continue
            stats = self._queue(lease.slot.key, lease.slot.protocol).stats
            stats.sessions += 1
            stats.session_total += now - lease.granted_at
        if keep:
            self._leases_of[server] = keep
        else:
            del self._leases_of[server]

    # -- events ---------------------------------------------------------------------------

    def put(self, server: Peer, key: str, host: str, port, matchkey: str, now: float,
            protocol: str = "") -> list[Match]:
        """A server offers a session.  Offering a port again ends the leases on that port."""
        if server in self._leases_of:
            self._end_leases(server, now, port)
        if matchkey in self._slots_of.get(server, ()):     # the same offer twice: keep the first
            return []
        slot = Slot(server, key, host, port, matchkey, now, protocol)
        if protocol not in self._protocols and len(self._protocols) < MAX_HINTED_PROTOCOLS:
            self._protocols[protocol] = None
        return self._schedule(self._offer(slot), now)

    def request(self, client: Peer, key: str, priority: int, now: float, protocol: str = "",
                host=None) -> list[Match]:
        """Queue a request (``host``: where ``client`` connects from, for the per-host bound).

        Raises ProtocolError when ``host``'s waiting requests are at their bound and ``client``
        holds as many as any other connection of that host."""
        queue = self._queue(key, protocol)
        request = Request(client, key, priority, next(self._seq), now, False, protocol)
        if queue.free and not queue.live_requests:     # nobody waits ahead of it: served at once
            _, slot = queue.free.popitem(last=False)
            return [self._grant(queue, slot, request, now)]
        mine = self._requests_of.setdefault(client, [])
        if host is not None:
            if self._waiting_per_host[host] >= self.max_requests_per_host:
                try:
                    self._make_room(client, host, key)
                except ProtocolError:
                    if queue.idle and not queue.offered:
                        self._delete_queue((key, protocol))
                    raise
            self._host_of[client] = host
            self._waiting_on.setdefault(host, {})[client] = None
            self._waiting_per_host[host] += 1
        heapq.heappush(queue.waiting, (-priority, len(mine), request.seq, request))
        queue.live_requests += 1
        mine.append(request)
        return self._schedule(queue, now)

    def _make_room(self, client: Peer, host, key: str) -> None:
        """``host`` is at its bound: evict the oldest request of its heaviest connection, unless
        that is ``client`` itself (or one that holds no more than it)."""
        heaviest = max(self._waiting_on[host], key=lambda c: len(self._requests_of[c]))
        held = len(self._requests_of[heaviest])
        if heaviest is client or held <= len(self._requests_of.get(client, ())):
            if not self._requests_of.get(client):
                del self._requests_of[client]
            raise ProtocolError(
                f"connections from {host} hold {self._waiting_per_host[host]} waiting requests, the "
                f"tracker's limit per host, and this one holds {held} of them, as many as any other: "
                "wait for some to be served before adding more")
        oldest = self._requests_of[heaviest][0]
        self._cancel_request(oldest)
        self.evictions.append(Eviction(heaviest, oldest.key, (
            f"request for key {oldest.key!r} dropped: connections from {host} hold "
            f"{self.max_requests_per_host} waiting requests, the tracker's limit per host, and this "
            f"connection held the most ({held}); its oldest request made room for another connection's "
            f"request for key {key!r}")))

    def pop_evictions(self) -> list[Eviction]:
        evictions, self.evictions = self.evictions, []
        return evictions

    def _forget_request(self, request: Request) -> None:
        """Take ``request`` (served or cancelled) off its client's list and its host's count."""
        client = request.client
        waiting = self._requests_of[client]
        waiting.remove(request)
        host = self._host_of.get(client)
        if host is not None:
            self._waiting_per_host[host] -= 1
        if not waiting:
            del self._requests_of[client]
            if host is not None:
                self._forget_host(client, host)

    def _forget_host(self, client: Peer, host) -> None:
        del self._host_of[client]
        clients = self._waiting_on[host]
        del clients[client]
        if not clients:
            del self._waiting_on[host]
            del self._waiting_per_host[host]

    def _cancel_request(self, request: Request) -> None:
        """A waiting request leaves its queue (its client went away, or it was evicted)."""
        request.cancelled = True
        qid = (request.key, request.protocol)
        queue = self._queues[qid]
        queue.live_requests -= 1
        if queue.idle and not queue.offered:
            self._delete_queue(qid)
        elif len(queue.waiting) > 2 * queue.live_requests + 64:   # keep cancelled entries bounded
            queue.waiting = [item for item in queue.waiting if not item[-1].cancelled]
            heapq.heapify(queue.waiting)
        self._forget_request(request)

    def cancel(self, match: Match, now: float) -> list[Match]:
        """The client could not be told about ``match``: the slot goes back to the front of its queue."""
        leases = self._leases_of.get(match.slot.server, [])
        for lease in leases:
            if lease.slot is match.slot:
                leases.remove(lease)
                break
        else:
            return []
        if not leases:
            del self._leases_of[match.slot.server]
        queue = self._queue(match.slot.key, match.slot.protocol)
        queue.stats.matches -= 1
        queue.stats.queue_wait_total -= lease.queue_wait
        self._offer(match.slot, front=True)
        return self._schedule(queue, now)

    def _offer(self, slot: Slot, front: bool = False) -> _Queue:
        self._slots_of.setdefault(slot.server, {})[slot.matchkey] = slot
        queue = self._queue(slot.key, slot.protocol)
        if not queue.offered:
            queue.offered = True
            self._unserved.discard((slot.key, slot.protocol))
        if slot.server in self._quarantined:   # indexed (GET_PENDING_MATCHKEYS lists it), not handed out
            return queue
        queue.free[id(slot)] = slot
        if front:
            queue.free.move_to_end(id(slot), last=False)
        return queue

    def free_elsewhere(self, key: str, protocol: str) -> list[str]:
        """Protocols other than ``protocol`` with free slots for ``key``: why a request waits."""
        return [p or UNMARKED for p in self._protocols
                if p != protocol and (q := self._queues.get((key, p))) is not None and q.free]

    def report_unreachable(self, key: str, matchkey: str, now: float) -> Peer | None:
        """A client could not reach the server of the slot it got with ``matchkey``: end that
        lease and hold the server's slots back for ``quarantine`` seconds.  Returns the server,
        or None when no slot of ``key`` with that match key was handed out."""
        for server, leases in self._leases_of.items():
            lease = next((x for x in leases if x.slot.matchkey == matchkey and x.slot.key == key), None)
            if lease is not None:
                leases.remove(lease)
                if not leases:
                    del self._leases_of[server]
                break
        else:                                 # its lease expired, and it went back to the pool
            slot = next((x for slots in self._slots_of.values() for x in slots.values()
                         if x.matchkey == matchkey and x.key == key), None)
            if slot is None:
                return None
            server = slot.server
        self._quarantined[server] = now + self.quarantine
        for slot in self._slots_of.get(server, {}).values():
            queue = self._queues.get((slot.key, slot.protocol))
            if queue is not None:
                queue.free.pop(id(slot), None)
        return server

    def _release_quarantines(self, now: float, touched: dict) -> None:
        for server, until in list(self._quarantined.items()):
            if until > now:
                continue
            del self._quarantined[server]
            for slot in self._slots_of.get(server, {}).values():
                queue = self._queue(slot.key, slot.protocol)
                queue.free[id(slot)] = slot
                touched[(slot.key, slot.protocol)] = queue

    def holds(self, peer: Peer) -> bool:
        """Whether ``peer`` has slots, leases, waiting requests or reports sessions."""
        return (peer in self._slots_of or peer in self._requests_of or peer in self._leases_of
                or peer in self._reporting)

    def offered(self, key: str, protocol: str = "") -> bool:
        queue = self._queues.get((key, protocol))
        return queue is not None and queue.offered

    def has_queue(self, key: str, protocol: str = "") -> bool:
        return (key, protocol) in self._queues

    def unserved_keys(self) -> int:
        """Keys that clients wait for and that no server has offered."""
        return len(self._unserved)

    def unserved_count(self, client: Peer) -> int:
        """The client's waiting requests for keys that no server has offered."""
        return sum(1 for r in self._requests_of.get(client, ()) if (r.key, r.protocol) in self._unserved)

    def host_waiting_count(self, host) -> int:
        """Waiting requests of ``host``'s connections (those queued with ``host=``)."""
        return self._waiting_per_host.get(host, 0)

    def waiting_count(self, client: Peer) -> int:
        return len(self._requests_of.get(client, ()))

    def free_count(self, server: Peer) -> int:
        return len(self._slots_of.get(server, ()))

    def pending_matchkeys(self, server: Peer) -> list[str]:
        """The server's match keys that are offered and not handed out (GET_PENDING_MATCHKEYS)."""
        return list(self._slots_of.get(server, ()))

    def reports_sessions(self, server: Peer) -> None:
        """The server tells the tracker when a session starts, so its leases may expire."""
        self._reporting.add(server)

    def session_started(self, server: Peer, now: float) -> None:
        """The server is busy: its leases are in use and its free slots are withdrawn."""
        self._reporting.add(server)
        for lease in self._leases_of.get(server, ()):
            lease.in_session = True
            lease.expires_at = None
        for slot in list(self._slots_of.get(server, {}).values()):
            self._withdraw(slot)

    def _withdraw(self, slot: Slot) -> None:
        queue = self._queues.get((slot.key, slot.protocol))
        if queue is not None:
            queue.free.pop(id(slot), None)
        self._discard_free(slot)

    def drop_client(self, client: Peer) -> None:
        """The client's connection closed: its waiting requests leave their queues now."""
        for request in list(self._requests_of.get(client, ())):
            self._cancel_request(request)

    def drop_server(self, server: Peer, now: float) -> None:
        """The server's connection closed: its free slots and leases are gone."""
        for slot in list(self._slots_of.get(server, {}).values()):
            self._withdraw(slot)
        self._end_leases(server, now)
        self._reporting.discard(server)
        self._quarantined.pop(server, None)

    def drop(self, peer: Peer, now: float) -> None:
        self.drop_client(peer)
        self.drop_server(peer, now)

    def expire(self, now: float) -> list[Match]:
        """Return expired leases' slots to the pool (at the back) and match them."""
        touched = {}
        for server, leases in list(self._leases_of.items()):
            for lease in [x for x in leases if x.expires_at is not None and x.expires_at <= now]:
                leases.remove(lease)
                slot = lease.slot
                queue = self._queue(slot.key, slot.protocol)
                queue.stats.expired_leases += 1
                self._offer(Slot(server, slot.key, slot.host, slot.port, slot.matchkey, now, slot.protocol))
                touched[(slot.key, slot.protocol)] = queue
            if not leases:
                del self._leases_of[server]
        if self._quarantined:
            self._release_quarantines(now, touched)
        matches = []
        for queue in touched.values():
            matches += self._schedule(queue, now)
        return matches

    def next_expiry(self) -> float | None:
        times = [lease.expires_at for leases in self._leases_of.values() for lease in leases
                 if lease.expires_at is not None]
        return min(times, default=None)

    # -- reporting ------------------------------------------------------------------------

    def _per_key(self) -> dict[str, list]:
        """``key -> [free, pending, offered]``, all session protocols together."""
        total: dict[str, list] = {}
        for (key, _), q in self._queues.items():
            entry = total.get(key)
            if entry is None:
                total[key] = [len(q.free), q.live_requests, q.offered]
            else:
                entry[0] += len(q.free)
                entry[1] += q.live_requests
                entry[2] = entry[2] or q.offered
        return total

    def queue_info(self) -> dict:
        """TVM's ``queue_info``: every key seen, with its free slots and waiting requests."""
        return dict(self.queue_rows())

    def queue_rows(self):
        """``queue_info`` as rows, keys that servers offered first, then by waiting requests."""
        order = sorted(self._per_key().items(), key=lambda kv: (not kv[1][2], -kv[1][1]))
        return ((key, {"free": free, "pending": pending}) for key, (free, pending, _) in order)

    def protocol_info(self, limit: int | None = None) -> dict:
        """The same counts per key and session protocol: who can be served by whom."""
        info: dict[str, dict] = {}
        for (key, protocol), q in itertools.islice(self._queues.items(), limit):
            info.setdefault(key, {})[protocol or UNMARKED] = {"free": len(q.free), "pending": q.live_requests}
        return info

    def key_count(self) -> int:
        return len({key for key, _ in self._queues})

    def lease_count(self) -> int:
        return sum(map(len, self._leases_of.values()))

    def lease_info(self, now: float, describe=lambda peer: None, limit: int | None = None) -> list[dict]:
        """Open leases, oldest first (the first ``limit``), without match keys (they are the
        servers' secrets)."""
        every = (x for ls in self._leases_of.values() for x in ls)
        granted = operator.attrgetter("granted_at")
        leases = sorted(every, key=granted) if limit is None else heapq.nsmallest(limit, every, key=granted)
        return [{"key": x.slot.key, "protocol": x.slot.protocol or UNMARKED,
                 "server": [x.slot.host, x.slot.port], "client": describe(x.request.client),
                 "priority": x.request.priority, "state": "session" if x.in_session else "leased",
                 "age": round(now - x.granted_at, 6), "queue_wait": round(x.queue_wait, 6)}
                for x in leases]

    def wait_info(self, now: float, describe=lambda peer: None, limit: int | None = None):
        """Waiting requests in the order they will be served, per queue.  With ``limit``: the
        first ``limit`` of them and how many there are in all."""
        out = []
        total = 0
        for (key, protocol), queue in sorted(self._queues.items()):
            total += queue.live_requests
            if limit is not None and len(out) >= limit:
                continue
            live = [item for item in queue.waiting if not item[-1].cancelled]
            live = sorted(live) if limit is None else heapq.nsmallest(limit - len(out), live)
            out += [{"key": key, "protocol": protocol or UNMARKED, "client": describe(r.client),
                     "priority": r.priority, "waited": round(now - r.requested_at, 6)} for *_, r in live]
        return out if limit is None else (out, total)

    def key_stats(self, limit: int | None = None) -> dict:
        """Per device key (the first ``limit`` keys with matches), all session protocols together."""
        total: dict[str, KeyStats] = {}
        for (key, _), q in self._queues.items():
            if q.stats.matches and (key in total or limit is None or len(total) < limit):
                total[key] = total[key] + q.stats if key in total else q.stats
        return {key: stats.to_dict() for key, stats in total.items()}

    def matched_key_count(self) -> int:
        return len({key for (key, _), q in self._queues.items() if q.stats.matches})
