"""Proxy overhead: round trip and copy bandwidth, direct vs through a proxy, in one run.

    PYTHONPATH=src python bench/proxy.py [--quick] [--no-tvm] [--raw-only]

Two levels, each measured direct and through the proxies side by side:

* raw: a byte-echo device process (no RPC) -- shows the relay's own cost;
* session (when ``kernelrpc.server`` exists): our client and device server, an RPC
  call round trip and tensor copies to the device and back.

"TVM proxy" rows use ``python -m tvm.exec.rpc_proxy`` when apache-tvm is installed.
Targets (issue 5): round trip at most 1.3x direct, 64 MiB copies at least 70% of direct.
The last line is the floor under any relay in a third process: one loopback TCP hop between
two polling C processes (needs ``cc``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import re
import socket
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

from kernelrpc.wire import handshake as hs  # noqa: E402
from procs import recv_exactly  # noqa: E402

MIB = 1 << 20
HEADER = struct.Struct("<QQ")  # bytes the client sends next, bytes the device answers


# -- processes ----------------------------------------------------------------
class Proc:
    """A child process whose stdout is scanned for a ready line."""

    def __init__(self, args: list[str], ready: str, then: str | None = None):
        env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, start_new_session=True)
        pattern = re.compile(ready)
        self.match = None
        for line in self.p.stdout:
            self.match = self.match or pattern.search(line)
            if self.match and (then is None or then in line):
                threading.Thread(target=self.p.stdout.read, daemon=True).start()  # keep draining
                return
        raise RuntimeError(f"{args} exited before printing {ready!r}")

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, 15)
        self.p.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_our_proxy(relay: str, prefix: list[str], spin_us: float | None) -> tuple[Proc, tuple[str, int]]:
    spin = ["--relay-spin-us", str(spin_us)] if relay == "native" and spin_us is not None else []
    proc = Proc([*prefix, sys.executable, "-m", "kernelrpc.proxy", "--port", "0", "--log-level",
                 "WARNING", "--relay", relay, *spin], r"listening on (\S+):(\d+)")
    return proc, (proc.match.group(1), int(proc.match.group(2)))


def start_tvm_proxy() -> tuple[Proc, tuple[str, int]] | None:
    try:
        import tvm  # noqa: F401
    except ImportError:
        return None
    port = free_port()
    proc = Proc([sys.executable, "-m", "tvm.exec.rpc_proxy", "--host", "127.0.0.1", "--port",
                 str(port), "--port-end", str(port + 50), "--web-port", "0"],
                r"client port bind to (\S+):(\d+)", then="Websock port bind")  # logged once it listens
    return proc, (proc.match.group(1), int(proc.match.group(2)))


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
def serve_echo(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(64 * MIB + 16)
    zeros = bytes(64 * MIB)
    while True:
        head = bytearray(HEADER.size)
        try:
            recv_exactly(sock, HEADER.size, head)
        except ConnectionError:
            return
        n_in, n_out = HEADER.unpack(head)
        recv_exactly(sock, n_in, buf)
        sock.sendall(memoryview(zeros)[:n_out])


def device_main(mode: str, host: str, port: int) -> None:
    if mode == "listen":
        srv = socket.create_server(("127.0.0.1", 0))
        print(f"echo device listening on 127.0.0.1:{srv.getsockname()[1]}", flush=True)
        conn, _ = srv.accept()
        serve_echo(conn)
        return
    while True:
        sock = socket.create_connection((host, port))
        sock.sendall(hs.encode_preamble("server:bench"))
        print("echo device connected", flush=True)
        parser = hs.ReplyParser()
        reply = None
        while reply is None:
            data = sock.recv(4096)
            if not data:
                raise SystemExit("proxy closed")
            reply = parser.feed(data)
        if not reply.ok:
            continue
        serve_echo(sock)


def raw_client(address, via_proxy: bool) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if via_proxy:
        sock.sendall(hs.encode_preamble("client:bench"))
        parser = hs.ReplyParser()
        reply = None
        while reply is None:
            reply = parser.feed(sock.recv(4096))
        reply.raise_for_code("proxy")
    return sock


class RawPath:
    """A byte-echo device and one client connection to it (direct or through a proxy)."""

    def __init__(self, name: str, address) -> None:
        if address is None:
            self.device = Proc([sys.executable, __file__, "--device", "listen", "-", "0"],
                               r"listening on (\S+):(\d+)")
            target = (self.device.match.group(1), int(self.device.match.group(2)))
        else:
            self.device = Proc([sys.executable, __file__, "--device", "proxy", address[0],
                                str(address[1])], "echo device connected")
            target = address
        self.sock = raw_client(target, address is not None)
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


def measure(paths, path_type, sizes, rtt_count: int, rounds: int) -> dict:
    """Interleave the paths round by round so that load from other processes hits all alike.

    Round trip: the best round's median; copies: the median over the rounds (a direct
    copy now and then runs much faster than usual on a shared machine, and comparing
    against that outlier says more about the neighbours than about the relay).
    """
    opened = {}
    try:
        for name, address in paths:
            opened[name] = path_type(name, address)
        medians = {name: [] for name in opened}
        copy_times = {name: {n: [] for n in sizes} for name in opened}
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
                    t = time.perf_counter()
                    path.copy(n)
                    copy_times[name][n].append(time.perf_counter() - t)
        return {name: {"rtt": min(medians[name]),
                       **{n: 2 * n / statistics.median(copy_times[name][n]) for n in sizes}}
                for name in opened}
    finally:
        for path in opened.values():
            path.close()


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

    def __init__(self, name: str, address) -> None:
        from kernelrpc.rpc.client import connect
        if address is None:
            self.device = Proc([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--key",
                                "bench", "--log-level", "WARNING"], r"listening on (\S+):(\d+)")
            target = (self.device.match.group(1), int(self.device.match.group(2)))
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


# -- report -----------------------------------------------------------------------
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--no-tvm", action="store_true", help="skip TVM's proxy")
    p.add_argument("--relay", nargs="+", default=["native", "splice"], choices=["native", "splice", "copy"],
                   help="our proxy's relays to measure (default: native splice)")
    p.add_argument("--raw-only", action="store_true", help="skip the RPC session level")
    p.add_argument("--pin-proxy", metavar="CPUS",
                   help="run our proxies on these CPUs (taskset list); run the bench itself "
                        "under taskset to place the client and the devices")
    p.add_argument("--spin-us", type=float, help="--relay-spin-us for our native relay")
    p.add_argument("--device", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device:
        device_main(args.device[0], args.device[1], int(args.device[2]))
        return
    sizes = [1 * MIB, 16 * MIB, 64 * MIB]
    rtt_count, rounds = (150, 2) if args.quick else (400, 6)
    procs = []
    proxy_prefix = ["taskset", "-c", args.pin_proxy] if args.pin_proxy else []
    try:
        paths = [("direct", None)]
        for relay in args.relay:
            started = start_our_proxy(relay, proxy_prefix, args.spin_us)
            procs.append(started[0])
            paths.append((f"ours ({relay})", started[1]))
        tvm = None if args.no_tvm else start_tvm_proxy()
        if tvm:
            procs.append(tvm[0])
            paths.append(("TVM proxy", tvm[1]))
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; paths measured in "
              f"{rounds} interleaved rounds. Round trip: best round's median of {rtt_count}; "
              "copies: to the device and back, MB/s = 2*size/median time")
        print_table("raw relay (byte-echo device, no RPC)",
                    measure(paths, RawPath, sizes, rtt_count, rounds), sizes)
        if not args.raw_only and session_available():
            print_table("RPC session (kernelrpc client and device server; echo call, tensor copies)",
                        measure(paths, SessionPath, sizes, rtt_count, rounds), sizes)
        elif not args.raw_only:
            print("\nRPC session level skipped: kernelrpc.server / kernelrpc.rpc.client not available")
        hop = measure_hop_us()
        if hop is not None:
            print(f"\nfloor: one loopback TCP hop with both ends polling "
                  f"costs {hop:.2f} us; a relay adds two hops, {2 * hop:.1f} us, to every round trip")
    finally:
        for proc in procs:
            proc.stop()


if __name__ == "__main__":
    main()
