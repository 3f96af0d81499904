"""Session speed against raw Python loopback TCP, measured in the same run.

    PYTHONPATH=src python bench/rpc.py [--calls N] [--repeat R] [--no-tvm] [--pin same|split|none]

Prints the round trip of a trivial remote call (``testing.echo(1)``) next to a
raw ping-pong of the same size, and tensor copy bandwidth in both directions
(1, 16, 64 MiB) next to raw socket throughput; with the ratios. When apache-tvm
is importable, TVM's RPC is measured too, for reference.

By default client and servers share one CPU (``--pin same``): on this kind of
machine a cross-CPU wake-up costs tens of microseconds, and leaving placement
to the scheduler (``--pin none``) gives the raw reference and kernelrpc
different placements from run to run. ``--pin split`` measures the cross-CPU case.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc import nd, rpc  # noqa: E402

SIZES_MIB = (1, 16, 64)
PING_BYTES = 32

RAW_SERVER = r'''
import socket, struct, sys
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print("raw listening on 127.0.0.1:%d" % srv.getsockname()[1], flush=True)
buf = bytearray(64 << 20)
view = memoryview(buf)
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mode = conn.recv(1)
    if mode == b"p":                      # ping-pong: echo fixed-size messages
        while True:
            msg = conn.recv(65536)
            if not msg: break
            conn.sendall(msg)
    elif mode == b"u":                    # upload: u64 size, then size bytes into buf, ack
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8: break
            n = struct.unpack("<Q", head)[0]; pos = 0
            while pos < n: pos += conn.recv_into(view[pos:n])
            conn.sendall(b"k")
    elif mode == b"d":                    # download: u64 size, reply with size bytes of buf
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8: break
            conn.sendall(view[:struct.unpack("<Q", head)[0]])
    conn.close()
'''


SERVER_CPUS: set[int] | None = None  # set by --pin: where the servers run


def _pin_server() -> None:
    if SERVER_CPUS is not None:
        os.sched_setaffinity(0, SERVER_CPUS)


def start(cmd: list[str], pattern: str, env=None) -> tuple[subprocess.Popen, tuple[str, int]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=_pin_server)
    for line in proc.stdout:
        m = re.search(pattern, line)
        if m:
            return proc, (m.group(1), int(m.group(2)))
    raise RuntimeError(f"{cmd} did not start")


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e6, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def round_trips(raw_addr, addr, calls: int, rounds: int = 20) -> tuple[list[float], list[float]]:
    """Raw ping-pong and ``echo(1)`` in alternating blocks, so load from other processes hits both."""
    raw_samples, our_samples = [], []
    with socket.create_connection(raw_addr) as sock, rpc.connect(*addr) as sess:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"p")
        msg = b"x" * PING_BYTES

        def ping():
            sock.sendall(msg)
            got = 0
            while got < PING_BYTES:
                got += len(sock.recv(65536))
        echo = sess.get_function("testing.echo")
        call = lambda: echo(1)  # noqa: E731
        timed(ping, calls // 10)
        timed(call, calls // 10)
        for _ in range(rounds):
            raw_samples += timed(ping, calls // rounds)
            our_samples += timed(call, calls // rounds)
    return raw_samples, our_samples


def raw_copy(addr, mode: bytes, nbytes: int, repeat: int) -> float:
    source = bytearray(os.urandom(1024)) * (nbytes // 1024)
    target = bytearray(nbytes)
    with socket.create_connection(addr) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(mode)
        head = nbytes.to_bytes(8, "little")

        def upload():
            sock.sendall(head)
            sock.sendall(source)
            sock.recv(1)

        def download():
            sock.sendall(head)
            view, pos = memoryview(target), 0
            while pos < nbytes:
                pos += sock.recv_into(view[pos:])
        return min(timed(upload if mode == b"u" else download, repeat))


def copies(addr, repeat: int) -> dict:
    out = {}
    with rpc.connect(*addr) as sess:
        for mib in SIZES_MIB:
            array = np.random.default_rng(0).integers(0, 255, mib << 20, dtype=np.uint8)
            remote = nd.array(array, sess.cpu(0))
            out[("up", mib)] = min(timed(lambda: remote.copyfrom(array), repeat))
            out[("down", mib)] = min(timed(remote.numpy, repeat))
            assert np.array_equal(remote.numpy(), array)
    return out


def tvm_reference(calls: int) -> dict | None:
    try:
        import tvm
        from tvm import rpc as tvm_rpc
    except ImportError:
        return None
    proc, addr = start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", "9300", "--port-end", "9400"],
                       r"bind to (\S+):(\d+)")
    try:
        sess = None
        deadline = time.monotonic() + 20
        while sess is None:  # TVM's server prints its "bind to" line before it listens
            try:
                sess = tvm_rpc.connect(*addr)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        echo = sess.get_function("testing.echo")
        out = {"rtt": timed(lambda: echo(1), calls // 4)}
        dev = sess.cpu(0)
        for mib in SIZES_MIB[:2]:
            array = np.zeros(mib << 20, dtype=np.uint8)
            remote = tvm.runtime.tensor(array, dev)
            out[("up", mib)] = min(timed(lambda: remote.copyfrom(array), 2))
            out[("down", mib)] = min(timed(remote.numpy, 2))
        return out
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--pin", choices=("none", "same", "split"), default="same",
                        help="CPU placement of client and servers: as the scheduler likes, all on one "
                             "CPU, or client and servers on different CPUs (cross-CPU wake-ups)")
    args = parser.parse_args()
    global SERVER_CPUS
    if args.pin != "none":
        cpus = sorted(os.sched_getaffinity(0))
        client_cpu = {cpus[0]}
        SERVER_CPUS = client_cpu if args.pin == "same" or len(cpus) == 1 else {cpus[1]}
        os.sched_setaffinity(0, client_cpu)
    env = dict(os.environ, PYTHONPATH=str(SRC))
    server, addr = start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level", "WARNING"],
                         r"listening on (\S+):(\d+)", env)
    raw, raw_addr = start([sys.executable, "-c", RAW_SERVER], r"listening on (\S+):(\d+)")
    try:
        ping, ours_result = round_trips(raw_addr, addr, args.calls)
        ours_result = {"rtt": ours_result, **copies(addr, args.repeat)}
        raw_copies = {(mode, mib): raw_copy(raw_addr, b"u" if mode == "up" else b"d", mib << 20, args.repeat)
                      for mode in ("up", "down") for mib in SIZES_MIB}
        tvm_result = None if args.no_tvm else tvm_reference(args.calls)
    finally:
        for proc in (server, raw):
            proc.kill()
            proc.wait()

    print(f"Round trip of a trivial call ({args.calls} calls; raw = {PING_BYTES}-byte TCP ping-pong; "
          f"CPU placement: {args.pin})")
    print(f"{'':24}{'median us':>12}{'p99 us':>12}{'median ratio':>14}")
    raw_med, raw_p99 = percentiles(ping)
    rows = [("raw Python TCP", ping), ("kernelrpc echo(1)", ours_result["rtt"])]
    if tvm_result:
        rows.append(("apache-tvm echo(1)", tvm_result["rtt"]))
    for name, samples in rows:
        med, p99 = percentiles(samples)
        print(f"{name:24}{med:12.1f}{p99:12.1f}{med / raw_med:13.2f}x")
    print()
    print(f"Tensor copy bandwidth (best of {args.repeat}; raw = loopback TCP into a preallocated buffer)")
    print(f"{'':24}{'raw MB/s':>12}{'kernelrpc MB/s':>16}{'ratio':>8}" + (f"{'tvm MB/s':>12}" if tvm_result else ""))
    for mode, label in (("up", "host->device"), ("down", "device->host")):
        for mib in SIZES_MIB:
            nbytes = mib << 20
            raw_bw = nbytes / raw_copies[(mode, mib)] / 1e6
            our_bw = nbytes / ours_result[(mode, mib)] / 1e6
            line = f"{label + f' {mib} MiB':24}{raw_bw:12.0f}{our_bw:16.0f}{our_bw / raw_bw:7.0%} "
            if tvm_result:
                t = tvm_result.get((mode, mib))
                line += f"{nbytes / t / 1e6:11.0f}" if t else f"{'-':>11}"
            print(line)


if __name__ == "__main__":
    main()
