"""Tracker benchmark: kernelrpc's tracker side by side with Apache TVM's and a floor, in one run.

    python bench/tracker.py [--servers 200] [--clients 100] [--requests 2000] [--bursts 3]
                            [--rates 1000,5000,10000] [--no-tvm] [--no-floor]

Each tracker runs as users start it (``python -m ...``); the load comes from a
separate process (this script with ``--load``, the load generator below: raw non-blocking
sockets, one ``selectors`` loop, pre-encoded frames) so that the two share the machine's CPUs
as a tracker and its users would.  ``--servers`` servers register (UPDATE_INFO +
PUT) and offer a fresh match key each time one of theirs is handed out (a
zero-length session).

* Full load (closed loop): each of ``--clients`` clients, on its own connection,
  keeps one REQUEST outstanding and sends the next as soon as its reply arrives,
  until a burst of ``--requests`` matches is done.  By Little's law the mean
  latency is then clients / throughput: this latency is mostly queueing.
* Fixed rate (open loop): REQUESTs at a fixed total rate, round robin over the
  clients, whatever the replies: the tracker's own delay at that load.

Latency is per request: REQUEST sent to its reply received.  Also reported:
SUMMARY and PING round trips with all servers registered, the CPU time the
tracker and the load generator spent per match, and process start to ready line.
The same load runs against TVM's tracker (when apache-tvm is installed) and
against the floor (this script with ``--floor``, below), the least a Python tracker can do
per message.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import procs
from procs import recv_exactly

SRC = Path(__file__).resolve().parents[1] / "src"
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


# -- the floor (--floor, a process of its own) --------------------------------------
def floor_main() -> None:
    """The least a Python tracker can do per message, to judge the real one against.

    One ``selectors`` loop on raw sockets; per message one ``recv``, ``json.loads``, a
    first-in first-out match of requests to offered slots, ``json.dumps`` of the reply
    and one ``send``.  No validation, priorities, leases, limits or error handling: it
    is not a tracker, only a measure of what this machine and the load generator allow
    a Python tracker to reach, so that the real one can be judged against it.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    print("floor listening on %s:%d" % listener.getsockname(), flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    free: collections.deque = collections.deque()
    waiting: collections.deque = collections.deque()
    servers = 0
    ok = frame(0)
    while True:
        for key, _ in selector.select():
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if conn.recv(4) == MAGIC:
                    conn.sendall(MAGIC)
                    conn.setblocking(False)
                    selector.register(conn, selectors.EVENT_READ, bytearray())
                continue
            data = sock.recv(65536)
            if not data:
                selector.unregister(sock)
                sock.close()
                continue
            buf = key.data
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + I32.unpack_from(buf)[0]:
                n = I32.unpack_from(buf)[0]
                msg = json.loads(buf[4:4 + n])
                del buf[:4 + n]
                code = msg[0]
                if code == 4:
                    waiting.append(sock)
                elif code == 3:
                    free.append(["127.0.0.1", msg[2][0], msg[2][1]])
                    sock.send(ok)
                elif code == 5:
                    servers += 1
                    sock.send(ok)
                elif code == 6:
                    sock.send(frame([0, {"queue_info": {"bench": {"free": len(free), "pending": len(waiting)}},
                                         "server_info": [{}] * servers}]))
                else:
                    sock.send(ok)
                while free and waiting:
                    waiting.popleft().send(frame([0, free.popleft()]))



# -- the load generator (--load HOST PORT TRACKER_PID, a process of its own) ---------
# Plays a fleet over raw non-blocking sockets and one ``selectors`` loop, so that it
# costs the shared CPUs as little as it can: frames are pre-encoded, a fake server's
# PUT acknowledgements are read in bulk after each burst rather than one by one, and
# a reply is decoded only far enough to find the matched server.  Latency is per
# request, from the clock read just before its REQUEST is sent to the clock read
# when ``select`` reports its reply readable.  Prints one JSON line of results,
# including the CPU time each side spent per match.
def read(sock: socket.socket, n: int) -> bytes:
    data = bytearray(n)
    recv_exactly(sock, n, data)
    return bytes(data)


def call(sock: socket.socket, obj):
    sock.sendall(frame(obj))
    return json.loads(read(sock, I32.unpack(read(sock, 4))[0]))


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
    if read(sock, 4) != MAGIC:
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
        acks = read(self.sock, len(OK_FRAME) * self.unacked)
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
    """The load generator's whole run against the tracker at ``addr``: its figures."""
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


# -- the driver ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_timed(argv: list[str], ready: str) -> tuple[subprocess.Popen, tuple[str, int], float]:
    """``procs.start`` of ``python argv``, and the seconds from launch to its ready line."""
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc, addr = procs.start([sys.executable, *argv], ready, env)
    return proc, addr, time.perf_counter() - t0


def run_load(addr, tracker_pid: int, args) -> dict:
    argv = [sys.executable, __file__, "--load", addr[0], str(addr[1]), str(tracker_pid),
            "--servers", str(args.servers), "--clients", str(args.clients), "--requests", str(args.requests),
            "--bursts", str(args.bursts), "--rates", ",".join(str(r) for r in args.rates)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(argv, ready, args) -> dict:
    proc, addr, ready_s = start_timed(argv, ready)
    try:
        result = run_load(addr, proc.pid, args)
    finally:
        procs.stop(proc)
    readies = [ready_s]
    for _ in range(2):
        proc, _, ready_s = start_timed(argv, ready)
        procs.stop(proc)
        readies.append(ready_s)
    result["ready"] = statistics.median(readies)
    for rate, figures in result.pop("fixed").items():
        result[f"p50@{rate}"], result[f"p99@{rate}"] = figures["p50"], figures["p99"]
    return result


def tvm_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import tvm.rpc.tracker"], capture_output=True)
    return probe.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=200)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 5000, 10000],
                        help="total REQUEST rates (per second) of the fixed-rate runs")
    parser.add_argument("--no-tvm", action="store_true", help="skip the run against TVM's tracker")
    parser.add_argument("--no-floor", action="store_true", help="skip the run against the floor")
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=3, metavar=("HOST", "PORT", "TRACKER_PID"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        floor_main()
        return
    if args.load:
        host, port, tracker_pid = args.load
        print(json.dumps(run((host, int(port)), int(tracker_pid), args)), flush=True)
        return

    ours = measure(["-m", "kernelrpc.tracker", "--port", "0", "--log-level", "WARNING"],
                   r"kernelrpc\.tracker listening on (\S+):(\d+)", args)
    theirs = None
    if not args.no_tvm and tvm_available():
        port = free_port()
        theirs = measure(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                          "--port-end", str(port + 100)], r"bind to (\S+):(\d+)", args)
    floor = None if args.no_floor else measure([__file__, "--floor"],
                                               r"floor listening on (\S+):(\d+)", args)

    print(f"tracker benchmark: {args.servers} servers, {args.clients} clients, each on its own connection, "
          f"load from a separate process.\n  full load: closed loop, each client keeps 1 REQUEST outstanding, "
          f"{args.bursts} bursts of {args.requests} matches (median burst; latencies over all bursts)\n"
          f"  fixed rate: open loop, REQUESTs evenly spaced, round robin over the clients, "
          f"min({args.requests}, 2 s worth) per rate\n"
          f"  latency: per request, clock before its REQUEST is sent -> clock when its reply is readable")
    print(f"{'metric':40s} {'kernelrpc':>11s} {'TVM 0.27':>11s} {'ratio':>8s} {'floor':>9s}   target")
    rows = [("matches/s, full load", "rate", 1, "{:11.0f}", True, ">= 3x TVM"),
            ("request->match p50, full load (ms)", "p50", 1e3, "{:11.2f}", False, ""),
            ("request->match p99, full load (ms)", "p99", 1e3, "{:11.2f}", False, "< 5 ms"),
            *[row for rate in args.rates for row in (
                (f"request->match p50, {rate}/s (ms)", f"p50@{rate}", 1e3, "{:11.2f}", False, ""),
                (f"request->match p99, {rate}/s (ms)", f"p99@{rate}", 1e3, "{:11.2f}", False, "< 5 ms"))],
            (f"SUMMARY round trip, {args.servers} servers (ms)", "summary", 1e3, "{:11.2f}", False, "< 5 ms"),
            ("PING round trip (ms)", "ping", 1e3, "{:11.2f}", False, ""),
            ("tracker CPU per match, full load (us)", "tracker_cpu_us", 1, "{:11.1f}", False, ""),
            ("load generator CPU per match (us)", "load_cpu_us", 1, "{:11.1f}", False, ""),
            ("process start -> ready (s)", "ready", 1, "{:11.3f}", False, "< 0.3 s")]
    for label, key, scale, fmt, higher_is_better, target in rows:
        mine = fmt.format(ours[key] * scale)
        if theirs is None:
            ref, ratio = f"{'n/a':>11s}", f"{'':>8s}"
        else:
            ref = fmt.format(theirs[key] * scale)
            num, den = (ours[key], theirs[key]) if higher_is_better else (theirs[key], ours[key])
            factor = num / den if den else float("inf")
            ratio = f"{factor:7.1f}x"
        least = f"{'n/a':>9s}" if floor is None or key == "ready" else f"{fmt.format(floor[key] * scale).strip():>9s}"
        print(f"{label:40s} {mine} {ref} {ratio} {least}   {target}")
    print(f"Little's law at full load: {args.clients} outstanding / {ours['rate']:.0f} matches/s = "
          f"{args.clients / ours['rate'] * 1e3:.2f} ms mean latency for kernelrpc; its bursts ran at "
          f"{', '.join(f'{r:.0f}' for r in ours['rates'])}/s")
    if floor is not None:
        print("floor: bench/tracker.py --floor, a raw selectors loop that only decodes, matches first-in first-out "
              "and replies (no validation): the most this machine and load generator allow a Python tracker")
    if theirs is None:
        print("(apache-tvm not installed or --no-tvm: no reference column)")
    else:
        print("ratio: how many times better kernelrpc is (throughput ours/TVM, times TVM/ours)")



if __name__ == "__main__":
    main()
