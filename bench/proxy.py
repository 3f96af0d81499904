"""The proxy's costs, each path side by side with its references in one run.

    PYTHONPATH=src python bench/proxy.py [--transport plain|tls|websocket|all] [--quick]
        plain:     [--no-tvm] [--raw-only] [--relay native splice copy] [--pin-proxy CPUS] [--spin-us US]
        tls:       [--before OTHER/src]

``--transport plain`` (the default): round trip and copy bandwidth, direct and through the proxies,
at two levels:

* raw: a byte-echo device process (no RPC) -- shows the relay's own cost;
* session (when ``kernelrpc.server`` exists): our client and device server, an RPC
  call round trip and tensor copies to the device and back.

"TVM proxy" rows use ``python -m tvm.exec.rpc_proxy`` when apache-tvm is installed.
Targets (issue 5): round trip at most 1.3x direct, 64 MiB copies at least 70% of direct.
The last line is the floor under any relay in a third process: one loopback TCP hop between
two polling C processes (needs ``cc``).

``--transport tls``: the proxy's relays, plain (native, splice, copy) and TLS, and another tree's
proxy (``--before SRC``, e.g. the main branch) for before/after figures. Each path is a byte-echo
device that connects out to a proxy and one client through it (raw TVM handshake, no RPC), with
TLS on both legs for the TLS path: round trip of an 8-byte message, the bandwidth of a copy there
and back, and the proxy's CPU time per GiB of those copies (less noisy than the bandwidth on a
shared machine). The TLS path uses a throw-away CA (trustme, a test dependency).

``--transport websocket``: the proxy's WebSocket endpoint, our sans-IO codec against tornado's
WebSocketHandler. Both endpoints run in a proxy process of their own, on the proxy's asyncio loop,
pairing through the same matchmaker:

* "codec": the proxy as it is (``--web-port``: ``proxy/websocket.py`` + ``proxy/ws_relay.py``,
  the socket handed to the proxy's Python relay, frames cut and joined on the way);
* "tornado": a prototype (below, ``TornadoPeer`` / ``TornadoRelay``) serving ``/ws``
  with ``tornado.websocket.WebSocketHandler`` on the same loop; the TCP side is read with
  ``add_reader`` + ``recv`` and written with ``send`` / ``loop.sock_sendall``, backpressure through
  the futures of ``write_message`` and a future returned by ``on_message``. Figures and the
  decision they led to (the endpoint stays on the codec): docs/proxy.md.

A WebSocket peer (device, key ``server:wsbench``) pairs with a TCP peer (client) that echoes
(round trip) or sinks / sources (throughput) 64 MiB. Also: the proxy's start-up time (launch to
ready line) and the import cost of the proxy with and without tornado.

Paths are measured round by round, interleaved, so load from other processes hits all alike.
``--transport all`` runs the three in turn.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import shutil
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc.proxy import websocket as ws  # noqa: E402
from kernelrpc.wire import handshake as hs  # noqa: E402
from procs import recv_exactly  # noqa: E402

MIB = 1 << 20
HEADER = struct.Struct("<QQ")  # bytes the client sends next, bytes the device answers
LISTENING = r"listening on (\S+):(\d+)"


# -- processes ----------------------------------------------------------------
class Proc:
    """A child process (in a session of its own) whose output is scanned for a ready line, then
    drained in the background. ``match`` is the ready line's match, ``ready_s`` launch to it."""

    def __init__(self, args: list[str], ready: str, src: Path = SRC, then: str | None = None):
        env = dict(os.environ, PYTHONPATH=str(src), PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, start_new_session=True)
        pattern = re.compile(ready)
        self.match = None
        for line in self.p.stdout:
            self.match = self.match or pattern.search(line)
            if self.match and (then is None or then in line):
                self.ready_s = time.perf_counter() - started
                threading.Thread(target=self.p.stdout.read, daemon=True).start()  # keep draining
                return
        raise RuntimeError(f"{args} exited before printing {ready!r}")

    def address(self, group: int = 1) -> tuple[str, int]:
        """The (host, port) in the ready line's groups ``group`` and ``group + 1``."""
        return self.match.group(group), int(self.match.group(group + 1))

    def cpu_seconds(self) -> float:
        """CPU seconds the process has used (user + system, all threads)."""
        fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, 15)
        self.p.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_our_proxy(relay: str, prefix: list[str] = (), spin_us: float | None = None, src: Path = SRC,
                    tls: tuple[str, str] | None = None) -> Proc:
    spin = ["--relay-spin-us", str(spin_us)] if relay == "native" and spin_us is not None else []
    flags = ["--tls-ca", tls[0], "--tls-cert", tls[1]] if tls else []
    return Proc([*prefix, sys.executable, "-m", "kernelrpc.proxy", "--port", "0", "--log-level",
                 "WARNING", "--relay", relay, *spin, *flags], LISTENING, src)


def start_tvm_proxy() -> Proc | None:
    try:
        import tvm  # noqa: F401
    except ImportError:
        return None
    port = free_port()
    return Proc([sys.executable, "-m", "tvm.exec.rpc_proxy", "--host", "127.0.0.1", "--port",
                 str(port), "--port-end", str(port + 50), "--web-port", "0"],
                r"client port bind to (\S+):(\d+)", then="Websock port bind")  # logged once it listens

# -- the floor: one loopback hop ---------------------------------------------
#: The floor: a C client and a C echo process ping-pong 8 bytes over loopback TCP, both polling
#: their sockets (``recv(MSG_DONTWAIT)`` in a loop) so that no wake-up is measured, only the
#: kernel's send and receive path. A round trip is two hops; a relay in a third process adds two
#: more, so ``2 * hop`` is what any user-space proxy adds to a round trip here. Needs ``cc``.
HOP_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void poll_recv(int s, char *b) {
  for (int got = 0; got < 8;) {
    int n = recv(s, b + got, 8 - got, MSG_DONTWAIT);
    if (n == 0) exit(0);
    if (n > 0) got += n;
  }
}
static int cmp(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  int one = 1, n = 100000;
  struct sockaddr_in addr = {AF_INET, 0, {htonl(INADDR_LOOPBACK)}};
  socklen_t len = sizeof addr;
  char b[8] = {0};
  if (argc > 1) { /* client of the echo process on port argv[1] */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_port = htons(atoi(argv[1]));
    if (connect(s, (void *)&addr, len)) { perror("connect"); return 1; }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    long *t = malloc(n * sizeof *t);
    for (int i = 0; i < n; i++) {
      long t0 = now_ns();
      send(s, b, 8, 0);
      poll_recv(s, b);
      t[i] = now_ns() - t0;
    }
    qsort(t, n, sizeof *t, cmp);
    printf("%.3f %.3f\n", t[n / 2] / 1e3, t[n * 9 / 10] / 1e3);
    return 0;
  }
  int l = socket(AF_INET, SOCK_STREAM, 0);
  bind(l, (void *)&addr, len);
  listen(l, 1);
  getsockname(l, (void *)&addr, &len);
  printf("%d\n", ntohs(addr.sin_port));
  fflush(stdout);
  int c = accept(l, 0, 0);
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (;;) {
    poll_recv(c, b);
    send(c, b, 8, 0);
  }
}
"""


def measure_hop_us() -> float | None:
    """Median microseconds per loopback hop (half a polling round trip), or None without cc."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "hop.c"), Path(tmp, "hop")
        src.write_text(HOP_SOURCE)
        subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
        echo = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
        try:
            port = echo.stdout.readline().strip()
            out = subprocess.run([str(exe), port], check=True, capture_output=True, text=True,
                                 timeout=120).stdout
        finally:
            echo.kill()
            echo.wait()
    median_rtt_us = float(out.split()[0])
    return median_rtt_us / 2


# -- raw echo device -----------------------------------------------------------
def serve_echo(sock) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64 * MIB + 16)
    zeros = bytes(64 * MIB)
    while True:
        try:
            recv_exactly(sock, HEADER.size, buf)
        except ConnectionError:
            return
        n_in, n_out = HEADER.unpack_from(buf)
        recv_exactly(sock, n_in, buf)
        sock.sendall(memoryview(zeros)[:n_out])


def read_reply(sock) -> hs.Reply:
    parser, reply = hs.ReplyParser(), None
    while reply is None:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError("proxy closed")
        reply = parser.feed(data)
    return reply


def device_main(host: str, port: int, ca: str | None) -> None:
    """The echo device: listening (``host`` "-"), or connected out to a proxy (TLS when ``ca``)."""
    if host == "-":
        srv = socket.create_server(("127.0.0.1", 0))
        print(f"echo device listening on 127.0.0.1:{srv.getsockname()[1]}", flush=True)
        serve_echo(srv.accept()[0])
        return
    context = ssl.create_default_context(cafile=ca) if ca else None
    while True:
        sock = socket.create_connection((host, port))
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        sock.sendall(hs.encode_preamble("server:bench"))
        print("echo device connected", flush=True)
        if read_reply(sock).ok:
            serve_echo(sock)
            return


def raw_client(address, via_proxy: bool, context: ssl.SSLContext | None = None):
    sock = socket.create_connection(address)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname=address[0])
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if via_proxy:
        sock.sendall(hs.encode_preamble("client:bench"))
        read_reply(sock).raise_for_code("proxy")
    return sock


class RawPath:
    """A byte-echo device and one client connection to it: direct (``address`` None) or through the
    proxy at ``address`` (``proxy`` its process, whose CPU time is counted; TLS when ``ca``)."""

    def __init__(self, address, proxy: Proc | None = None, ca: str | None = None) -> None:
        self.proxy = proxy
        if address is None:
            self.device = Proc([sys.executable, __file__, "--device", "-", "0", ""], LISTENING)
            self.sock = raw_client(self.device.address(), False)
        else:
            self.device = Proc([sys.executable, __file__, "--device", address[0], str(address[1]),
                                ca or ""], "echo device connected")
            self.sock = raw_client(address, True, ssl.create_default_context(cafile=ca) if ca else None)
        self.buf = bytearray(64 * MIB + 16)
        self.payload = bytes(64 * MIB)

    def _exchange(self, n_in: int, n_out: int) -> None:
        if n_in <= 4096:  # one segment, like an RPC request
            self.sock.sendall(HEADER.pack(n_in, n_out) + self.payload[:n_in])
        else:
            self.sock.sendall(HEADER.pack(n_in, n_out))
            self.sock.sendall(memoryview(self.payload)[:n_in])
        recv_exactly(self.sock, n_out, self.buf)

    def round_trip(self) -> None:
        self._exchange(8, 8)

    def copy(self, n: int) -> None:
        self._exchange(n, 1)  # to the device
        self._exchange(0, n)  # and back

    def close(self) -> None:
        self.sock.close()
        self.device.stop()


# -- RPC session level ---------------------------------------------------------------
def session_available() -> bool:
    try:
        import kernelrpc.rpc.client  # noqa: F401
        import kernelrpc.server.through_proxy  # noqa: F401
    except ImportError:
        return False
    return True


class SessionPath:
    """Our device server and one kernelrpc session with it (direct or through a proxy)."""

    proxy = None

    def __init__(self, address) -> None:
        from kernelrpc.rpc.client import connect
        if address is None:
            self.device = Proc([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--key",
                                "bench", "--log-level", "WARNING"], LISTENING)
            target = self.device.address()
        else:
            self.device = Proc([sys.executable, "-m", "kernelrpc.server", "--through-proxy",
                                "--host", address[0], "--port", str(address[1]), "--key", "bench",
                                "--log-level", "WARNING"], "connected to proxy")
            target = address
        self.sess = connect(*target, key="bench")
        self.echo = self.sess.get_function("testing.echo")
        self.host = bytearray(64 * MIB)
        self.tensors = {}

    def round_trip(self) -> None:
        self.echo(1)

    def copy(self, n: int) -> None:
        tensor = self.tensors.get(n) or self.tensors.setdefault(n, self.sess.empty((n,), "uint8"))
        view = memoryview(self.host)[:n]
        tensor.copyfrom(view)
        tensor.copyto_buffer(view)

    def close(self) -> None:
        self.tensors.clear()
        self.sess.close()
        self.device.stop()


def measure(paths: dict, sizes, rtt_count: int, rounds: int) -> dict:
    """Open every path (name -> a function that opens it), then interleave them round by round so
    that load from other processes hits all alike.

    Round trip: the best round's median; copies: the median over the rounds (a direct
    copy now and then runs much faster than usual on a shared machine, and comparing
    against that outlier says more about the neighbours than about the relay); the proxy's CPU
    seconds over all the copies (0 without a proxy process of the path's own).
    """
    opened = {}
    try:
        for name, open_path in paths.items():
            opened[name] = open_path()
        medians = {name: [] for name in opened}
        copy_times = {name: {n: [] for n in sizes} for name in opened}
        proxy_cpu = dict.fromkeys(opened, 0.0)
        for _ in range(rounds):
            for name, path in opened.items():
                for _ in range(20):
                    path.round_trip()
                times = []
                for _ in range(rtt_count):
                    t = time.perf_counter()
                    path.round_trip()
                    times.append(time.perf_counter() - t)
                medians[name].append(statistics.median(times))
                for n in sizes:
                    cpu = path.proxy.cpu_seconds() if path.proxy else 0.0
                    t = time.perf_counter()
                    path.copy(n)
                    copy_times[name][n].append(time.perf_counter() - t)
                    proxy_cpu[name] += (path.proxy.cpu_seconds() - cpu) if path.proxy else 0.0
        return {name: {"rtt": min(medians[name]), "proxy_cpu": proxy_cpu[name],
                       **{n: 2 * n / statistics.median(copy_times[name][n]) for n in sizes}}
                for name in opened}
    finally:
        for path in opened.values():
            path.close()


# -- --transport plain ---------------------------------------------------------------
def print_table(title: str, results: dict, sizes) -> None:
    names = list(results)
    base = results["direct"]
    print(f"\n{title}")
    head = f"{'metric':<26}" + "".join(f"{n:>16}" for n in names) + "".join(
        f"{'vs direct: ' + n:>28}" for n in names[1:])
    print(head)
    print("-" * len(head))
    row = f"{'round trip (us)':<26}" + "".join(
        f"{results[n]['rtt'] * 1e6:>16.1f}" for n in names)
    row += "".join(f"{results[n]['rtt'] / base['rtt']:>27.2f}x" for n in names[1:])
    print(row)
    for size in sizes:
        row = f"{f'copy {size // MIB} MiB (MB/s)':<26}" + "".join(
            f"{results[n][size] / 1e6:>16.0f}" for n in names)
        row += "".join(f"{100 * results[n][size] / base[size]:>27.0f}%" for n in names[1:])
        print(row)


def run_plain(args) -> None:
    sizes = [1 * MIB, 16 * MIB, 64 * MIB]
    rtt_count, rounds = (150, 2) if args.quick else (400, 6)
    procs = []
    proxy_prefix = ["taskset", "-c", args.pin_proxy] if args.pin_proxy else []
    try:
        addresses = {"direct": None}
        for relay in args.relay:
            procs.append(start_our_proxy(relay, proxy_prefix, args.spin_us))
            addresses[f"ours ({relay})"] = procs[-1].address()
        tvm = None if args.no_tvm else start_tvm_proxy()
        if tvm:
            procs.append(tvm)
            addresses["TVM proxy"] = tvm.address()
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; paths measured in "
              f"{rounds} interleaved rounds. Round trip: best round's median of {rtt_count}; "
              "copies: to the device and back, MB/s = 2*size/median time")
        for title, path_type in (("raw relay (byte-echo device, no RPC)", RawPath),
                                 ("RPC session (kernelrpc client and device server; echo call, tensor copies)",
                                  SessionPath)):
            if path_type is SessionPath and args.raw_only:
                break
            if path_type is SessionPath and not session_available():
                print("\nRPC session level skipped: kernelrpc.server / kernelrpc.rpc.client not available")
                break
            paths = {name: functools.partial(path_type, address) for name, address in addresses.items()}
            print_table(title, measure(paths, sizes, rtt_count, rounds), sizes)
        hop = measure_hop_us()
        if hop is not None:
            print(f"\nfloor: one loopback TCP hop with both ends polling "
                  f"costs {hop:.2f} us; a relay adds two hops, {2 * hop:.1f} us, to every round trip")
    finally:
        for proc in procs:
            proc.stop()


# -- --transport tls -----------------------------------------------------------------
def run_tls(args) -> None:
    import trustme

    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(f"{tmp}/ca.pem")
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(f"{tmp}/cert.pem")
        tls = (f"{tmp}/ca.pem", f"{tmp}/cert.pem")
        specs = [("native", "native", SRC, None), ("splice", "splice", SRC, None), ("copy", "copy", SRC, None),
                 ("copy (TLS)", "auto", SRC, tls)]
        if args.before:     # rows for a tree whose proxy has no TLS are left out, with a note
            specs = [(f"before {name}", relay, args.before, t) for name, relay, _, t in specs] + specs
        rtt_count, rounds, size = (200, 2, 16 * MIB) if args.quick else (500, 5, 64 * MIB)
        proxies = {}
        try:
            for name, relay, src, tls_files in specs:
                try:
                    proxies[name] = (start_our_proxy(relay, src=src, tls=tls_files), tls_files)
                except RuntimeError as exc:
                    print(f"{name}: not measured ({exc})")
            results = measure({name: functools.partial(RawPath, proxy.address(), proxy, t and t[0])
                               for name, (proxy, t) in proxies.items()}, [size], rtt_count, rounds)
        finally:
            for proxy, _ in proxies.values():
                proxy.stop()
    print(f"\nproxy relays, raw echo through the proxy (round trip: best round's median of {rtt_count}; "
          f"copy {size // MIB} MiB there and back: median of {rounds} rounds)")
    print(f"{'path':<20}{'round trip (us)':>18}{'copy (MB/s)':>14}{'proxy CPU (ms/GiB)':>20}")
    for name, r in results.items():
        per_gib = 1e3 * r["proxy_cpu"] / (2 * size * rounds / (1 << 30))
        print(f"{name:<20}{r['rtt'] * 1e6:>18.1f}{r[size] / 1e6:>14.0f}{per_gib:>20.0f}")


# -- --transport websocket -----------------------------------------------------------
WS_KEY = "wsbench"
WS_READY = r"listening on (\S+):(\d+) \(websocket ws://(\S+):(\d+)/ws\)"


# the tornado prototype (runs in the child: --serve tornado)
def tornado_service(config):
    """A ProxyService whose /ws endpoint is a tornado WebSocketHandler on the same loop."""
    import tornado.httpserver
    import tornado.netutil
    import tornado.web
    import tornado.websocket

    from kernelrpc.proxy.service import ProxyService
    from kernelrpc.wire.handshake import PreambleParser

    class TornadoPeer:
        """What the service's pairing asks of a connection, for a tornado handler."""

        decoder = None
        sock = None

        def __init__(self, service, handler):
            self._service, self.handler = service, handler
            self.name = f"ws:{handler.request.remote_ip}"
            self.waiter = self.timer = None
            self.closed = self.handed_over = False

        def refuse(self, reply: bytes) -> None:
            with contextlib.suppress(tornado.websocket.WebSocketClosedError):
                self.handler.write_message(reply, binary=True)
            self.close()

        def fail(self, reason: str) -> None:
            self.close(1002, reason)

        def close(self, code=1000, reason="") -> None:
            if self.closed or self.handed_over:
                return
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            self.handler.close(code, reason[:120])
            self._service.connection_closed(self)

        def handshake_expired(self) -> None:
            self.timer = None
            if self.waiter is None:
                self.fail(f"no complete handshake within {self._service.config.handshake_timeout:g}s")

        def hand_over(self):
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.handed_over = True

    class TornadoRelay:
        def __init__(self, loop, peer, sock, to_ws, to_tcp, on_close):
            self._loop, self._peer, self._sock = loop, peer, sock
            self._to_ws, self._to_tcp, self._on_close = to_ws, to_tcp, on_close
            self._task = None
            self._done = asyncio.Event()

        def start(self):
            self._peer.handler.relay = self
            self._task = self._loop.create_task(self._begin())

        async def _begin(self):
            try:
                await self._peer.handler.write_message(self._to_ws, binary=True)
                await self._loop.sock_sendall(self._sock, self._to_tcp)
            except (OSError, tornado.websocket.WebSocketClosedError):
                self.close()
                return
            self._loop.add_reader(self._sock.fileno(), self._readable)

        def _readable(self):
            try:
                data = self._sock.recv(MIB)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            try:
                written = self._peer.handler.write_message(data, binary=True)
            except tornado.websocket.WebSocketClosedError:
                self.close()
                return
            if not written.done():  # backpressure: stop reading until tornado flushed it
                self._loop.remove_reader(self._sock.fileno())
                written.add_done_callback(self._resume)

        def _resume(self, _):
            if not self._done.is_set():
                self._loop.add_reader(self._sock.fileno(), self._readable)

        def from_ws(self, message: bytes):
            """None when the TCP peer took it all, else a future tornado waits for."""
            try:
                sent = self._sock.send(message)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.close()
                return None
            if sent == len(message):
                return None
            return self._loop.create_task(self._send_rest(memoryview(message)[sent:]))

        async def _send_rest(self, rest):
            try:
                await self._loop.sock_sendall(self._sock, rest)
            except OSError:
                self.close()

        def close(self):
            if self._done.is_set():
                return
            self._done.set()
            if self._task is not None and self._task is not asyncio.current_task():
                self._task.cancel()
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._sock.fileno())
            self._peer.handler.close()
            self._sock.close()
            self._on_close()

        async def wait_closed(self):
            await self._done.wait()

    class Handler(tornado.websocket.WebSocketHandler):
        def initialize(self, service):
            self.service = service
            self.relay = None
            self.parser = PreambleParser()

        def check_origin(self, origin):
            return True

        def open(self):
            self.peer = TornadoPeer(self.service, self)
            self.service.connections.add(self.peer)
            self.peer.timer = self.service._loop.call_later(
                self.service.config.handshake_timeout, self.peer.handshake_expired)
            self.set_nodelay(True)

        def on_message(self, message):
            if self.relay is not None:
                return self.relay.from_ws(message)
            if self.parser is None:
                self.peer.fail("sent data before it was paired")
                return
            key = self.parser.feed(message)
            if key is not None:
                unused, self.parser = self.parser.unused, None
                if unused:
                    self.peer.fail("sent data before it was paired")
                else:
                    self.service.handshake_done(self.peer, key)

        def on_close(self):
            if self.relay is not None:
                self.relay.close()
            else:
                self.service.peer_left(self.peer)
                self.peer.close()

    class TornadoProxy(ProxyService):
        async def start(self):
            address = await super().start()
            sockets = tornado.netutil.bind_sockets(0, self.config.host)
            app = tornado.web.Application([("/ws", Handler, {"service": self})])
            server = tornado.httpserver.HTTPServer(app, max_header_size=8192)
            server.add_sockets(sockets)
            self.web_address = sockets[0].getsockname()[:2]
            return address

        def _make_relay(self, a, b, *, to_a, to_b, on_close):
            if isinstance(a, TornadoPeer) and b.sock is not None:
                return TornadoRelay(self._loop, a, b.sock, to_a, to_b, on_close)
            if isinstance(b, TornadoPeer) and a.sock is not None:
                return TornadoRelay(self._loop, b, a.sock, to_b, to_a, on_close)
            return super()._make_relay(a, b, to_a=to_a, to_b=to_b, on_close=on_close)

    return TornadoProxy(config)


async def serve(mode: str) -> None:
    from kernelrpc.proxy.service import ProxyConfig, ProxyService

    config = ProxyConfig(port=0, web_port=None if mode == "tornado" else 0)
    service = tornado_service(config) if mode == "tornado" else ProxyService(config)
    host, port = await service.start()
    whost, wport = service.web_address
    print(f"listening on {host}:{port} (websocket ws://{whost}:{wport}/ws)", flush=True)
    await asyncio.Event().wait()


class WsPeer:
    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.decoder = ws.FrameDecoder(require_mask=False)
        self.events = []

    def frame(self, data: bytes) -> bytes:
        return ws.encode_frame(ws.BINARY, data, mask=b"\x00\x00\x00\x00")  # zero mask: client cost out

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.frame(data))

    def read(self, n: int) -> int:
        got = 0
        while got < n:
            while not self.events:
                data = self.sock.recv(4 * MIB)
                if not data:
                    raise ConnectionError(f"closed after {got} of {n} bytes")
                self.events += self.decoder.feed(data)
            event = self.events.pop(0)
            if isinstance(event, ws.Data):
                got += len(event.payload)
        return got


def pair(proc: Proc) -> tuple[WsPeer, socket.socket]:
    device = WsPeer(proc.address(3))
    device.send(hs.encode_preamble(f"server:{WS_KEY}"))
    client = socket.create_connection(proc.address(), timeout=30)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.sendall(hs.encode_preamble(f"client:{WS_KEY}"))
    reply = read_reply(client)
    assert reply.ok, reply
    parser, reply = hs.ReplyParser(), None
    while reply is None:
        event = device.events.pop(0) if device.events else None
        if event is None:
            device.events += device.decoder.feed(device.sock.recv(4096))
            continue
        reply = parser.feed(event.payload)
    assert reply.ok, reply
    return device, client


def round_trip_us(proc: Proc, count: int) -> tuple[float, float]:
    """Median round trip of a 64-byte message, and the proxy's CPU per round trip (us)."""
    device, client = pair(proc)
    cpu = proc.cpu_seconds()
    msg = b"x" * 64
    buf = bytearray(len(msg))
    samples = []
    for _ in range(count):
        t = time.perf_counter()
        device.send(msg)
        recv_exactly(client, len(msg), buf)
        client.sendall(msg)
        device.read(len(msg))
        samples.append(time.perf_counter() - t)
    cpu = proc.cpu_seconds() - cpu
    device.sock.close()
    client.close()
    return statistics.median(samples[count // 10:]) * 1e6, cpu / count * 1e6


def throughput(proc: Proc, total: int, chunk: int) -> tuple[float, float, float, float]:
    """MiB/s of ``total`` bytes TCP -> WebSocket, then WebSocket -> TCP (``chunk`` a message),
    and the proxy's CPU seconds for each."""
    device, client = pair(proc)
    block = os.urandom(chunk)
    sink = bytearray(total)
    cpu = proc.cpu_seconds()
    t = time.perf_counter()
    sender = threading.Thread(target=lambda: [client.sendall(block) for _ in range(total // chunk)])
    sender.start()
    device.read(total)
    sender.join()
    down = total / MIB / (time.perf_counter() - t)
    down_cpu, cpu = proc.cpu_seconds() - cpu, proc.cpu_seconds()
    frame = device.frame(block)
    t = time.perf_counter()
    sender = threading.Thread(target=lambda: [device.sock.sendall(frame) for _ in range(total // chunk)])
    sender.start()
    recv_exactly(client, total, sink)
    sender.join()
    up = total / MIB / (time.perf_counter() - t)
    up_cpu = proc.cpu_seconds() - cpu
    device.sock.close()
    client.close()
    return down, up, down_cpu, up_cpu


def import_ms(code: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return (time.perf_counter() - t) * 1e3


def run_websocket(args) -> None:
    runs, rtts, total = (2, 300, 16 * MIB) if args.quick else (5, 2000, 64 * MIB)
    keys = ("start", "rtt", "rtt_cpu", "down", "down_cpu", "up", "up_cpu", "up64k", "up64k_cpu")
    rows = {mode: {k: [] for k in keys} for mode in ("codec", "tornado")}
    for _ in range(runs):
        for mode, r in rows.items():  # interleaved: both see the same machine load
            proc = Proc([sys.executable, __file__, "--serve", mode], WS_READY)
            try:
                r["start"].append(proc.ready_s * 1e3)
                for k, v in zip(("rtt", "rtt_cpu"), round_trip_us(proc, rtts)):
                    r[k].append(v)
                down, up, down_cpu, up_cpu = throughput(proc, total, MIB)
                _, up64k, _, up64k_cpu = throughput(proc, total, 64 << 10)
                for k, v in zip(keys[3:], (down, down_cpu, up, up_cpu, up64k, up64k_cpu)):
                    r[k].append(v)
            finally:
                proc.stop()
    med = statistics.median
    print(f"\nWebSocket peer <-> TCP peer through the proxy: median of {runs} interleaved runs "
          f"({total // MIB} MiB transfers, {os.cpu_count()} cores); MiB/s with the proxy's "
          f"CPU seconds in ()")
    print(f"{'endpoint':<9}{'start ms':>9}{'rtt us (cpu)':>14}{'TCP->WS, 1M sends':>20}"
          f"{'WS->TCP, 1M msgs':>19}{'WS->TCP, 64K msgs':>19}")
    for mode, r in rows.items():
        cells = [f"{med(r[k]):.0f} ({med(r[k + '_cpu']):.2f})" for k in ("down", "up", "up64k")]
        print(f"{mode:<9}{med(r['start']):>9.0f}{med(r['rtt']):>8.0f} ({med(r['rtt_cpu']):.0f})"
              f"{cells[0]:>20}{cells[1]:>19}{cells[2]:>19}")
    base = "import kernelrpc.proxy.__main__"
    codes = {"python -c pass": "pass", "the proxy (as started without --web-port)": base,
             "the proxy + tornado.web/websocket/httpserver":
                 base + "; import tornado.websocket, tornado.web, tornado.httpserver"}
    best = {label: float("inf") for label in codes}
    for _ in range(10):  # interleaved, best of 10
        for label, code in codes.items():
            best[label] = min(best[label], import_ms(code))
    print("\nimport cost (a fresh interpreter, best of 10):")
    for label, ms in best.items():
        print(f"  {label:<46}{ms:>7.0f} ms")


TRANSPORTS = {"plain": run_plain, "tls": run_tls, "websocket": run_websocket}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", choices=[*TRANSPORTS, "all"], default="plain")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-tvm", action="store_true", help="plain: skip TVM's proxy")
    p.add_argument("--relay", nargs="+", default=["native", "splice"], choices=["native", "splice", "copy"],
                   help="plain: our proxy's relays to measure (default: native splice)")
    p.add_argument("--raw-only", action="store_true", help="plain: skip the RPC session level")
    p.add_argument("--pin-proxy", metavar="CPUS",
                   help="plain: run our proxies on these CPUs (taskset list); run the bench itself "
                        "under taskset to place the client and the devices")
    p.add_argument("--spin-us", type=float, help="plain: --relay-spin-us for our native relay")
    p.add_argument("--before", type=Path, help="tls: another tree's src/ whose proxy is measured too")
    p.add_argument("--device", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--serve", choices=["codec", "tornado"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device:
        device_main(args.device[0], int(args.device[1]), args.device[2] or None)
        return
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    for transport, run in TRANSPORTS.items():
        if args.transport in (transport, "all"):
            run(args)


if __name__ == "__main__":
    main()
