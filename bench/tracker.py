"""Tracker benchmark: kernelrpc's tracker side by side with Apache TVM's, in one run.

    python bench/tracker.py [--servers 200] [--clients 100] [--requests 2000] [--bursts 3] [--no-tvm]

Each tracker runs as users start it (``python -m ...``), alone on the machine while
measured.  The bench process plays the fleet over real sockets with raw protocol
peers: ``--servers`` servers register (UPDATE_INFO + PUT) and offer a fresh match key
each time one of their keys is handed out (a zero-length session); ``--clients``
clients, each on its own tracker connection, send REQUESTs back to back until a
burst of ``--requests`` matches is done.  Reported: matches per second (median
burst) and request-to-match latency p50/p99 over all bursts -- at saturation a closed
loop of N clients waits about N / throughput, so this latency is mostly queueing --
then the same latency with the clients paced to ``PACED_RATE`` requests per second
in total (the tracker's own delay), SUMMARY and PING round trips with all servers
registered, and the time from process start to ready line.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc.rpc.tracker_codec import MAGIC_BYTES, FrameDecoder, encode_frame  # noqa: E402

KEY = "bench"
PACED_RATE = 1000.0
"""Requests per second offered in the paced run, below both trackers' capacity."""


class Peer(asyncio.Protocol):
    """A raw tracker peer.  Replies come in order; each goes to the future (``call``) or
    the callback (``send``, None to ignore it) registered with its request.  The load
    loops use callbacks so that the bench process spends as little CPU per match as it
    can: on two cores it competes with the tracker it measures."""

    def __init__(self) -> None:
        self.opened = asyncio.get_running_loop().create_future()
        self.waiters: collections.deque = collections.deque()
        self._decoder = FrameDecoder()
        self._echo = b""
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(MAGIC_BYTES)

    def data_received(self, data: bytes) -> None:
        if not self.opened.done():
            self._echo += data
            if len(self._echo) < 4:
                return
            data = self._echo[4:]
            self.opened.set_result(self._echo[:4] == MAGIC_BYTES)
        for msg in self._decoder.feed(data):
            waiter = self.waiters.popleft()
            if waiter is not None:
                waiter(msg)

    def connection_lost(self, exc) -> None:
        if self.waiters:
            raise ConnectionError(f"tracker closed the connection with {len(self.waiters)} replies due")

    def send(self, frame: bytes, on_reply) -> None:
        self.waiters.append(on_reply)
        self.transport.write(frame)

    def call(self, msg) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.send(encode_frame(msg), future.set_result)
        return future


async def open_peer(addr) -> Peer:
    for attempt in range(100):    # TVM's tracker logs "bind to" before it calls listen()
        try:
            _, peer = await asyncio.get_running_loop().create_connection(Peer, *addr)
            break
        except ConnectionRefusedError:
            if attempt == 99:
                raise
            await asyncio.sleep(0.02)
    if not await peer.opened:
        raise RuntimeError(f"{addr} is not a tracker")
    return peer


class FakeServer:
    def __init__(self, peer: Peer, port: int) -> None:
        self.peer, self.port, self.generation = peer, port, 0

    def offer(self, on_reply=None) -> None:
        self.generation += 1
        self.peer.send(encode_frame([3, KEY, [self.port, f"{KEY}:{self.port}.{self.generation}"], None]), on_reply)


REQUEST = encode_frame([4, KEY, "", 1])


def run_clients(clients: list[Peer], servers: dict, count: int, latencies: list, interval: float = 0.0):
    """Each client sends REQUESTs one after another (``interval`` apart when paced, with the
    clients' phases spread evenly) until ``count`` matches are done; a matched server offers
    a fresh key at once.  Returns a future that completes with the last match."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"left": count, "due": count}

    def send(peer: Peer) -> None:
        state["left"] -= 1
        start = time.perf_counter()
        peer.send(REQUEST, lambda reply: on_match(peer, start, reply))

    def on_match(peer: Peer, start: float, reply) -> None:
        latencies.append(time.perf_counter() - start)
        servers[reply[1][1]].offer()
        state["due"] -= 1
        if state["due"] == 0:
            done.set_result(None)
        elif state["left"] > 0:
            if interval:
                loop.call_at(loop.time() + max(0.0, start + interval - time.perf_counter()), send, peer)
            else:
                send(peer)

    for i, peer in enumerate(clients[:count]):
        loop.call_later(i * interval / len(clients), send, peer)
    return done


async def run_load(addr, n_servers: int, n_clients: int, n_requests: int, bursts: int) -> dict:
    servers = {}
    for i in range(n_servers):
        peer = await open_peer(addr)
        port = 20000 + i
        assert await peer.call([5, {"key": f"server:{KEY}", "addr": [None, port]}]) == 0
        servers[port] = FakeServer(peer, port)
        offered = asyncio.get_running_loop().create_future()
        servers[port].offer(offered.set_result)
        assert await offered == 0
    clients = [await open_peer(addr) for _ in range(n_clients)]
    latencies: list[float] = []
    rates = []

    for _ in range(bursts):
        start = time.perf_counter()
        await run_clients(clients, servers, n_requests, latencies)
        rates.append(n_requests / (time.perf_counter() - start))
    paced: list[float] = []
    await run_clients(clients, servers, n_requests, paced, interval=n_clients / PACED_RATE)
    probe = await open_peer(addr)
    while (await probe.call([6]))[1]["queue_info"][KEY]["free"] != n_servers:
        await asyncio.sleep(0.01)                 # let the last re-offers land
    summary_rtt, ping_rtt = [], []
    for _ in range(200):
        start = time.perf_counter()
        info = await probe.call([6])
        summary_rtt.append(time.perf_counter() - start)
        start = time.perf_counter()
        await probe.call([1])
        ping_rtt.append(time.perf_counter() - start)
    assert len(info[1]["server_info"]) == n_servers
    for peer in [probe, *clients, *(s.peer for s in servers.values())]:
        peer.transport.close()
    return {"rate": statistics.median(rates), "p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
            "paced50": percentile(paced, 50), "paced99": percentile(paced, 99),
            "summary": percentile(summary_rtt, 50), "ping": percentile(ping_rtt, 50)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], ready: str) -> tuple[subprocess.Popen, tuple[str, int], float]:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    pattern = re.compile(ready)
    for line in proc.stdout:
        match = pattern.search(line)
        if match:
            return proc, (match.group(1), int(match.group(2))), time.perf_counter() - t0
    raise RuntimeError(f"{argv} exited before its ready line")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 15)
    proc.wait(10)


def measure(argv, ready, args) -> dict:
    proc, addr, ready_s = start(argv, ready)
    try:
        result = asyncio.run(run_load(addr, args.servers, args.clients, args.requests, args.bursts))
    finally:
        stop(proc)
    readies = [ready_s]
    for _ in range(2):
        proc, _, ready_s = start(argv, ready)
        stop(proc)
        readies.append(ready_s)
    result["ready"] = statistics.median(readies)
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
    parser.add_argument("--no-tvm", action="store_true", help="skip the run against TVM's tracker")
    args = parser.parse_args()

    ours = measure(["-m", "kernelrpc.tracker", "--port", "0", "--log-level", "WARNING"],
                   r"kernelrpc\.tracker listening on (\S+):(\d+)", args)
    theirs = None
    if not args.no_tvm and tvm_available():
        port = free_port()
        theirs = measure(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                          "--port-end", str(port + 100)], r"bind to (\S+):(\d+)", args)

    print(f"tracker benchmark: {args.servers} servers, {args.clients} concurrent clients, "
          f"{args.bursts} bursts of {args.requests} requests (median burst; latencies over all)")
    print(f"{'metric':38s} {'kernelrpc':>11s} {'TVM 0.27':>11s} {'ratio':>8s}   target")
    rows = [("matches/s", "rate", 1, "{:11.0f}", True, ">= 3x TVM"),
            ("request->match p50, saturated (ms)", "p50", 1e3, "{:11.2f}", False, ""),
            ("request->match p99, saturated (ms)", "p99", 1e3, "{:11.2f}", False, ""),
            (f"request->match p50, {PACED_RATE:.0f}/s (ms)", "paced50", 1e3, "{:11.2f}", False, ""),
            (f"request->match p99, {PACED_RATE:.0f}/s (ms)", "paced99", 1e3, "{:11.2f}", False, "< 5 ms"),
            (f"SUMMARY round trip, {args.servers} servers (ms)", "summary", 1e3, "{:11.2f}", False, "< 5 ms"),
            ("PING round trip (ms)", "ping", 1e3, "{:11.2f}", False, ""),
            ("process start -> ready (s)", "ready", 1, "{:11.3f}", False, "< 0.3 s")]
    for label, key, scale, fmt, higher_is_better, target in rows:
        mine = fmt.format(ours[key] * scale)
        if theirs is None:
            ref, ratio = f"{'n/a':>11s}", f"{'':>8s}"
        else:
            ref = fmt.format(theirs[key] * scale)
            factor = ours[key] / theirs[key] if higher_is_better else theirs[key] / ours[key]
            ratio = f"{factor:7.1f}x"
        print(f"{label:38s} {mine} {ref} {ratio}   {target}")
    if theirs is None:
        print("(apache-tvm not installed or --no-tvm: no reference column)")
    else:
        print("ratio: how many times better kernelrpc is (throughput ours/TVM, times TVM/ours)")


if __name__ == "__main__":
    main()
