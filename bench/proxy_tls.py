"""The proxy's relays side by side in one run: plain (native, splice, copy) and TLS, and another
tree's proxy (``--before SRC``, e.g. the main branch) for before/after figures.

    PYTHONPATH=src python bench/proxy_tls.py [--quick] [--before /path/to/other/src]

Each path is a byte-echo device that connects out to a proxy and one client through it
(raw TVM handshake, no RPC), with TLS on both legs for the TLS path: round trip of an
8-byte message, the bandwidth of a copy there and back, and the proxy's CPU time per GiB
of those copies (less noisy than the bandwidth on a shared machine).  Paths are measured round by
round, interleaved, so load from other processes hits all alike.  The TLS path uses a
throw-away CA (trustme, a test dependency).
"""
from __future__ import annotations

import argparse
import contextlib
import os
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

from kernelrpc.wire import handshake as hs
from procs import recv_exactly  # noqa: E402

MIB = 1 << 20
HEADER = struct.Struct("<QQ")  # bytes the client sends next, bytes the device answers


class Proc:
    def __init__(self, args: list[str], ready: str, src: Path = SRC) -> None:
        env = dict(os.environ, PYTHONPATH=str(src), PYTHONUNBUFFERED="1")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=env, start_new_session=True)
        for line in self.p.stdout:
            if ready in line:
                self.line = line
                threading.Thread(target=self.p.stdout.read, daemon=True).start()
                return
        raise RuntimeError(f"{args} exited before printing {ready!r}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, 15)
        self.p.wait(10)


def paired(sock, key: str):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(hs.encode_preamble(key))
    parser, reply = hs.ReplyParser(), None
    while reply is None:
        reply = parser.feed(sock.recv(4096))
    reply.raise_for_code("proxy")
    return sock


def open_peer(address, key: str, context: ssl.SSLContext | None):
    sock = socket.create_connection(address)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname=address[0])
    return paired(sock, key)


def device_main(host: str, port: int, ca: str | None) -> None:
    context = ssl.create_default_context(cafile=ca) if ca else None
    print("echo device connecting", flush=True)
    sock = open_peer((host, port), "server:bench", context)
    buf = memoryview(bytearray(64 * MIB + 16))
    zeros = bytes(64 * MIB)
    while True:
        try:
            recv_exactly(sock, HEADER.size, buf)
        except ConnectionError:
            return
        n_in, n_out = HEADER.unpack(buf[:HEADER.size])
        recv_exactly(sock, n_in, buf)
        sock.sendall(memoryview(zeros)[:n_out])


class Path_:
    def __init__(self, relay: str, src: Path, tls: tuple[str, str] | None) -> None:
        flags = ["--tls-ca", tls[0], "--tls-cert", tls[1]] if tls else []
        self.proxy = Proc([sys.executable, "-m", "kernelrpc.proxy", "--port", "0", "--log-level", "WARNING",
                           "--relay", relay, *flags], "listening on", src)
        host, port = self.proxy.line.split("listening on ")[1].split()[0].rsplit(":", 1)
        address = (host, int(port))
        self.device = Proc([sys.executable, __file__, "--device", host, port, tls[0] if tls else ""],
                           "echo device connecting")
        context = ssl.create_default_context(cafile=tls[0]) if tls else None
        self.sock = open_peer(address, "client:bench", context)
        self.buf = memoryview(bytearray(64 * MIB + 16))
        self.payload = bytes(64 * MIB)

    def exchange(self, n_in: int, n_out: int) -> None:
        self.sock.sendall(HEADER.pack(n_in, n_out) + self.payload[:n_in] if n_in <= 4096 else HEADER.pack(n_in, n_out))
        if n_in > 4096:
            self.sock.sendall(memoryview(self.payload)[:n_in])
        recv_exactly(self.sock, n_out, self.buf)

    def proxy_cpu(self) -> float:
        """CPU seconds the proxy process has used (user + system, all threads)."""
        fields = Path(f"/proc/{self.proxy.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.sock.close()
        self.device.stop()
        self.proxy.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--before", type=Path, help="another tree's src/ whose proxy is measured too")
    p.add_argument("--device", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device:
        device_main(args.device[0], int(args.device[1]), args.device[2] or None)
        return
    import trustme

    tmp = Path(tempfile.mkdtemp(prefix="bench-tls-"))
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp / "cert.pem"))
    tls = (str(tmp / "ca.pem"), str(tmp / "cert.pem"))
    specs = [("native", "native", SRC, None), ("splice", "splice", SRC, None), ("copy", "copy", SRC, None),
             ("copy (TLS)", "auto", SRC, tls)]
    if args.before:     # rows for a tree whose proxy has no TLS are left out, with a note
        specs = [(f"before {name}", relay, args.before, t) for name, relay, _, t in specs] + specs
    rtt_count, rounds, size = (200, 2, 16 * MIB) if args.quick else (500, 5, 64 * MIB)
    paths = {}
    try:
        for name, relay, src, tls_files in specs:
            try:
                paths[name] = Path_(relay, src, tls_files)
            except RuntimeError as exc:
                print(f"{name}: not measured ({exc})")
        rtts = {n: [] for n in paths}
        copies = {n: [] for n in paths}
        cpu = {n: 0.0 for n in paths}
        for _ in range(rounds):
            for name, path in paths.items():
                for _ in range(20):
                    path.exchange(8, 8)
                times = []
                for _ in range(rtt_count):
                    t = time.perf_counter()
                    path.exchange(8, 8)
                    times.append(time.perf_counter() - t)
                rtts[name].append(statistics.median(times))
                t, c = time.perf_counter(), path.proxy_cpu()
                path.exchange(size, 1)
                path.exchange(0, size)
                copies[name].append(2 * size / (time.perf_counter() - t))
                cpu[name] += path.proxy_cpu() - c
    finally:
        for path in paths.values():
            path.close()
    print(f"\nproxy relays, raw echo through the proxy (round trip: best round's median of {rtt_count}; "
          f"copy {size // MIB} MiB there and back: median of {rounds} rounds)")
    print(f"{'path':<20}{'round trip (us)':>18}{'copy (MB/s)':>14}{'proxy CPU (ms/GiB)':>20}")
    for name in paths:
        per_gib = 1e3 * cpu[name] / (2 * size * rounds / (1 << 30))
        print(f"{name:<20}{min(rtts[name]) * 1e6:>18.1f}{statistics.median(copies[name]) / 1e6:>14.0f}"
              f"{per_gib:>20.0f}")


if __name__ == "__main__":
    main()
