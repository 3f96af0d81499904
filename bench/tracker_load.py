"""The load generator of ``bench/tracker.py``, run in its own process.

    python bench/tracker_load.py HOST PORT TRACKER_PID --servers 200 --clients 100 --requests 2000
        --bursts 3 --rates 1000,5000

Plays a fleet over raw non-blocking sockets and one ``selectors`` loop, so that it
costs the shared CPUs as little as it can: frames are pre-encoded, a fake server's
PUT acknowledgements are read in bulk after each burst rather than one by one, and
a reply is decoded only far enough to find the matched server.  Latency is per
request, from the clock read just before its REQUEST is sent to the clock read
when ``select`` reports its reply readable.  Prints one JSON line of results,
including the CPU time each side spent per match.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import socket
import struct
import time

KEY = "bench"
MAGIC = struct.pack("<i", 0x2F271)
I32 = struct.Struct("<i")
OK_FRAME = I32.pack(1) + b"0"
REQUEST = (lambda body: I32.pack(len(body)) + body)(json.dumps([4, KEY, "", 1]).encode())
TICKS = os.sysconf("SC_CLK_TCK")
clock = time.perf_counter


def frame(obj) -> bytes:
    body = json.dumps(obj).encode()
    return I32.pack(len(body)) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("tracker closed the connection")
        data += chunk
    return data


def call(sock: socket.socket, obj):
    sock.sendall(frame(obj))
    return json.loads(recv_exactly(sock, I32.unpack(recv_exactly(sock, 4))[0]))


def open_peer(addr) -> socket.socket:
    for attempt in range(100):      # TVM's tracker prints its ready line before it calls listen()
        try:
            sock = socket.create_connection(addr)
            break
        except ConnectionRefusedError:
            if attempt == 99:
                raise
            time.sleep(0.02)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC)
    if recv_exactly(sock, 4) != MAGIC:
        raise RuntimeError(f"{addr} is not a tracker")
    return sock


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and its descendants (TVM's tracker runs in a child)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS)
    tree = {pid}
    for _ in range(4):
        tree |= {p for p, (parent, _) in stats.items() if parent in tree}
    return sum(stats[p][1] for p in tree if p in stats)


class FakeServer:
    """A registered server that offers a fresh match key each time it is handed out."""

    def __init__(self, addr, port: int) -> None:
        self.sock = open_peer(addr)
        self.port, self.generation, self.unacked = port, 0, 0
        if call(self.sock, [5, {"key": f"server:{KEY}", "addr": [None, port]}]) != 0:
            raise RuntimeError("UPDATE_INFO was refused")
        self.offer()
        self.drain()
        self.sock.setblocking(False)

    def offer(self) -> None:
        self.generation += 1
        body = b'[3, "%s", [%d, "%s:%d.%d"], null]' % (KEY.encode(), self.port, KEY.encode(), self.port,
                                                       self.generation)
        self.sock.send(I32.pack(len(body)) + body)
        self.unacked += 1

    def drain(self) -> None:
        """Read the PUT acknowledgements due so far; each must be SUCCESS."""
        self.sock.setblocking(True)
        acks = recv_exactly(self.sock, len(OK_FRAME) * self.unacked)
        self.sock.setblocking(False)
        if acks != OK_FRAME * self.unacked:
            raise RuntimeError(f"a PUT was not acknowledged with SUCCESS: {acks[:64]!r}")
        self.unacked = 0


class Client:
    def __init__(self, addr) -> None:
        self.sock = open_peer(addr)
        self.sock.setblocking(False)
        self.buf = b""
        self.sent: collections.deque[float] = collections.deque()


class Load:
    def __init__(self, addr, n_servers: int, n_clients: int) -> None:
        self.servers = {20000 + i: FakeServer(addr, 20000 + i) for i in range(n_servers)}
        self.clients = [Client(addr) for _ in range(n_clients)]
        self.selector = selectors.DefaultSelector()
        for client in self.clients:
            self.selector.register(client.sock, selectors.EVENT_READ, client)

    def send(self, client: Client) -> None:
        client.sent.append(clock())
        client.sock.send(REQUEST)

    def receive(self, client: Client, now: float, latencies: list) -> int:
        """Record the replies in the client's buffer; re-offer each matched server."""
        data = client.sock.recv(65536)
        if not data:
            raise ConnectionError("tracker closed a client connection")
        buf = client.buf + data if client.buf else data
        done = 0
        while len(buf) >= 4:
            n = I32.unpack_from(buf)[0]
            if len(buf) < 4 + n:
                break
            reply = json.loads(buf[4:4 + n])
            buf = buf[4 + n:]
            if reply[0] != 0:
                raise RuntimeError(f"REQUEST failed: {reply!r}")
            latencies.append(now - client.sent.popleft())
            self.servers[reply[1][1]].offer()
            done += 1
        client.buf = buf
        return done

    def closed_loop(self, count: int, latencies: list) -> None:
        """Every client keeps one REQUEST outstanding (the next goes out on its reply)
        until ``count`` replies have come back."""
        left = count
        for client in self.clients[:count]:
            self.send(client)
            left -= 1
        due = count
        while due:
            events = self.selector.select()
            now = clock()
            for selector_key, _ in events:
                client = selector_key.data
                got = self.receive(client, now, latencies)
                due -= got
                for _ in range(min(got, left)):
                    self.send(client)
                    left -= 1
        self.settle()

    def open_loop(self, count: int, rate: float, latencies: list) -> None:
        """REQUESTs at a fixed total ``rate``, round robin over the clients, whatever the replies."""
        start = clock()
        sent = due = 0
        while due < count:
            now = clock()
            while sent < count and start + sent / rate <= now:
                self.send(self.clients[sent % len(self.clients)])
                sent += 1
            timeout = None if sent == count else max(0.0, start + sent / rate - clock())
            events = self.selector.select(timeout)
            now = clock()
            for selector_key, _ in events:
                due += self.receive(selector_key.data, now, latencies)
        self.settle()

    def settle(self) -> None:
        for server in self.servers.values():
            server.drain()

    def close(self) -> None:
        for peer in [*self.clients, *self.servers.values()]:
            peer.sock.close()


def percentile(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def round_trips(addr, msg, count: int) -> tuple[list, object]:
    """``count`` round trips of ``msg`` on a fresh connection: their durations and the last reply."""
    sock = open_peer(addr)
    out = []
    for _ in range(count):
        start = clock()
        reply = call(sock, msg)
        out.append(clock() - start)
    sock.close()
    return out, reply


def run(addr, tracker_pid: int, args) -> dict:
    load = Load(addr, args.servers, args.clients)
    latencies, rates, tracker_cpu, own_cpu = [], [], 0.0, 0.0
    for _ in range(args.bursts):
        cpu0, own0, start = cpu_seconds(tracker_pid), time.process_time(), clock()
        load.closed_loop(args.requests, latencies)
        rates.append(args.requests / (clock() - start))
        tracker_cpu += cpu_seconds(tracker_pid) - cpu0
        own_cpu += time.process_time() - own0
    matches = args.requests * args.bursts
    result = {"rate": sorted(rates)[len(rates) // 2], "rates": rates,
              "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
              "tracker_cpu_us": tracker_cpu / matches * 1e6, "load_cpu_us": own_cpu / matches * 1e6,
              "fixed": {}}
    for rate in args.rates:
        paced: list[float] = []
        load.open_loop(min(args.requests, int(rate * 2)), rate, paced)
        result["fixed"][str(int(rate))] = {"p50": percentile(paced, 50), "p99": percentile(paced, 99)}
    summary_rtt, info = round_trips(addr, [6], 200)
    if len(info[1]["server_info"]) != args.servers or info[1]["queue_info"][KEY]["free"] != args.servers:
        raise RuntimeError(f"SUMMARY does not show {args.servers} free servers: {info[1]['queue_info']}")
    result["summary"] = percentile(summary_rtt, 50)
    result["ping"] = percentile(round_trips(addr, [1], 200)[0], 50)
    load.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("tracker_pid", type=int)
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",") if x], default=[1000.0])
    args = parser.parse_args()
    print(json.dumps(run((args.host, args.port), args.tracker_pid, args)), flush=True)


if __name__ == "__main__":
    main()
