"""Session speed against raw Python loopback TCP, measured in the same run.

    PYTHONPATH=src python bench/rpc.py [--calls N] [--block B] [--repeat R] [--no-tvm] [--copies-only]
                                       [--pin same|split|none]

Prints the round trip of a trivial remote call (``testing.echo(1)``) next to a
raw ping-pong of about the same size, the small session operations a tuner
repeats (allocate and fill a tiny tensor, look up and drop a function, a
kernel call with two remote tensors, the first call on a new session, a whole
``time_evaluator`` call, the first ``connect_tracker()`` of a process), and
tensor copy bandwidth in both
directions (1, 16, 64 MiB) next to raw socket throughput; with the ratios. When
apache-tvm is importable, TVM's RPC is measured too, for reference.

The round trips of raw TCP, kernelrpc and TVM are timed call by call in small
interleaved blocks (rotating which goes first), so bursts of load from other
processes hit all rows alike. Each row shows the median and p99 over all its
calls, the ratio of its median to the raw median, and the 10th-90th percentile
range of the same ratio computed block by block (how stable the ratio is).

By default client and servers share one CPU (``--pin same``): on this kind of
machine a cross-CPU wake-up costs tens of microseconds, and leaving placement
to the scheduler (``--pin none``) gives the raw reference and kernelrpc
different placements from run to run. ``--pin split`` measures the cross-CPU
case. Every row always gets the same placement; the output says which.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc import nd, rpc  # noqa: E402
import procs  # noqa: E402
from procs import stop  # noqa: E402

SIZES_MIB = (1, 16, 64)
PING_BYTES = 32

RAW_SERVER = r'''
import socket, struct, threading
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print("raw listening on 127.0.0.1:%d" % srv.getsockname()[1], flush=True)

def serve(conn):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(64 << 20))
    mode = conn.recv(1)
    if mode == b"p":                      # ping-pong: echo fixed-size messages
        while True:
            msg = conn.recv(65536)
            if not msg: break
            conn.sendall(msg)
    elif mode == b"u":                    # upload: u64 size, then size bytes into a buffer, ack
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8: break
            n = struct.unpack("<Q", head)[0]; pos = 0
            while pos < n: pos += conn.recv_into(view[pos:n])
            conn.sendall(b"k")
    elif mode == b"d":                    # download: u64 size, reply with size bytes of a buffer
        while True:
            head = conn.recv(8, socket.MSG_WAITALL)
            if len(head) < 8: break
            conn.sendall(view[:struct.unpack("<Q", head)[0]])
    conn.close()

while True:                               # one thread per connection (they are used one at a time)
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
'''


SERVER_CPUS: set[int] | None = None  # set by --pin: where the servers run


def _pin_server() -> None:
    if SERVER_CPUS is not None:
        os.sched_setaffinity(0, SERVER_CPUS)


def start(cmd: list[str], pattern: str, env=None) -> tuple[subprocess.Popen, tuple[str, int]]:
    """procs.start with every server on the placement ``--pin`` chose."""
    return procs.start(cmd, pattern, env, preexec_fn=_pin_server)


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


def raw_pinger(addr):
    """A ``PING_BYTES`` ping-pong on a raw TCP connection to the raw echo server."""
    sock = socket.create_connection(addr)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"p")
    msg = b"x" * PING_BYTES

    def ping():
        sock.sendall(msg)
        got = 0
        while got < PING_BYTES:
            got += len(sock.recv(65536))
    return sock, ping


def round_trips(contenders: dict, calls: int, block: int) -> tuple[dict, list[list[float]]]:
    """Time every contender in interleaved blocks of ``block`` calls, rotating the order.

    Load from other processes comes and goes in bursts; interleaving small blocks spreads it over
    all contenders alike. Returns the samples of each contender and, per block, the ratio of each
    contender's block median to the raw block median (index 0 is the raw reference).
    """
    names = list(contenders)
    samples = {name: [] for name in names}
    block_ratios = []
    for fn in contenders.values():
        timed(fn, max(block, calls // 20))  # warm-up
    for b in range(max(1, calls // block)):
        medians = {}
        for i in range(len(names)):
            name = names[(b + i) % len(names)]
            got = timed(contenders[name], block)
            samples[name] += got
            medians[name] = statistics.median(got)
        block_ratios.append([medians[name] / medians[names[0]] for name in names])
    return samples, block_ratios


def raw_copier(addr, mode: bytes):
    """Raw loopback copies of ``n`` bytes to (``b"u"``) or from (``b"d"``) the raw server's buffer."""
    sock = socket.create_connection(addr)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(mode)
    source = bytearray(os.urandom(1024)) * ((max(SIZES_MIB) << 20) // 1024)
    target = bytearray(max(SIZES_MIB) << 20)

    def upload(nbytes: int) -> None:
        sock.sendall(nbytes.to_bytes(8, "little"))
        sock.sendall(memoryview(source)[:nbytes])
        sock.recv(1)

    def download(nbytes: int) -> None:
        sock.sendall(nbytes.to_bytes(8, "little"))
        view, pos = memoryview(target), 0
        while pos < nbytes:
            pos += sock.recv_into(view[pos:nbytes])
    return sock, upload if mode == b"u" else download


def copies(raw_addr, addr, repeat: int) -> tuple[dict, dict]:
    """Seconds of each of ``repeat`` copies per size and direction, raw and kernelrpc alternating
    so both see the same load, all on one connection each (the first copies of a connection
    included: the spread is part of the result)."""
    raw, ours = {}, {}
    up_sock, raw_up = raw_copier(raw_addr, b"u")
    down_sock, raw_down = raw_copier(raw_addr, b"d")
    with up_sock, down_sock, rpc.connect(*addr) as sess:
        for mib in SIZES_MIB:
            nbytes = mib << 20
            array = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
            remote = nd.array(array, sess.cpu(0))
            pairs = {"up": (partial(raw_up, nbytes), partial(remote.copyfrom, array)),
                     "down": (partial(raw_down, nbytes), remote.numpy)}
            for mode, (raw_fn, our_fn) in pairs.items():
                raw_times, our_times = [], []
                for _ in range(repeat):
                    raw_times += timed(raw_fn, 1)
                    our_times += timed(our_fn, 1)
                raw[(mode, mib)], ours[(mode, mib)] = raw_times, our_times
            assert np.array_equal(remote.numpy(), array)
    return raw, ours


def start_tvm():
    """An Apache TVM rpc_server and a session with it, or None when apache-tvm is missing."""
    try:
        from tvm import rpc as tvm_rpc
    except ImportError:
        return None
    return _start_tvm(tvm_rpc)


class FreshTVMServer:
    """The TVM server the first-call row opens its new sessions on (TVM serves one at a time)."""

    def __init__(self) -> None:
        self.proc, probe, self.addr = start_tvm()
        del probe  # ends the probe session, so the first-call row finds this server free

    def restart(self) -> None:
        stop(self.proc)
        self.__init__()

    def stop(self) -> None:
        stop(self.proc)


def _start_tvm(tvm_rpc):
    proc, addr = start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", "9300",
                        "--port-end", "9400"], r"bind to (\S+):(\d+)")
    deadline = time.monotonic() + 20
    while True:  # TVM's server prints its "bind to" line before it listens
        try:
            return proc, tvm_rpc.connect(*addr), addr
        except Exception:
            if time.monotonic() > deadline:
                stop(proc)
                raise
            time.sleep(0.1)


def tvm_copies(sess) -> dict:
    import tvm

    out = {}
    dev = sess.cpu(0)
    for mib in SIZES_MIB[:2]:  # 64 MiB takes over a second each way at TVM's speed
        array = np.zeros(mib << 20, dtype=np.uint8)
        remote = tvm.runtime.tensor(array, dev)
        out[("up", mib)] = min(timed(lambda: remote.copyfrom(array), 2))
        out[("down", mib)] = min(timed(remote.numpy, 2))
    return out


# ---------------------------------------------------------------- small session operations

ADDONE_ELEMENTS = 1
KERNEL_CALL = "remote kernel call f(a, b), 1-element tensors"


def build_addone(directory: str) -> str:
    """A 1-element kernel exported by kernelrpc, for the whole time_evaluator call."""
    import kernelrpc
    from kernelrpc import te

    a = te.placeholder((ADDONE_ELEMENTS,), name="A")
    b = te.compute((ADDONE_ELEMENTS,), lambda i: a[i] + 1.0, name="B")
    path = os.path.join(directory, "addone.so")
    kernelrpc.build(te.create_schedule(b.op), [a, b], target="llvm", name="addone").export_library(path)
    return path


def build_tvm_addone(directory: str) -> str | None:
    """The same kernel exported by TVM, or None (logged) when this TVM cannot build it."""
    try:
        import tvm
        from tvm import te

        a = te.placeholder((ADDONE_ELEMENTS,), "float32", "A")
        b = te.compute((ADDONE_ELEMENTS,), lambda i: a[i] + 1.0, name="B")
        mod = tvm.compile(te.create_prim_func([a, b]).with_attr("global_symbol", "addone"), target="llvm")
        path = os.path.join(directory, "tvm_addone.so")
        mod.export_library(path)
        return path
    except Exception as exc:  # noqa: BLE001 - a reference row, printed as missing
        print(f"(TVM cannot build the time_evaluator kernel here: {exc})", file=sys.stderr)
        return None


def ours_ops(sess, addr, library: str) -> dict:
    """The small operations of kernelrpc, each a callable timed on its own."""
    dev = sess.cpu(0)
    four_bytes = np.ones(1, dtype="float32")
    sess.upload(library, "addone.so")
    mod = sess.load_module("addone.so")
    a, b = nd.array(np.zeros(ADDONE_ELEMENTS, "float32"), dev), nd.empty((ADDONE_ELEMENTS,), "float32", dev)
    evaluator = mod.time_evaluator("addone", dev, number=100, repeat=20)
    addone = mod.get_function("addone")

    def first_call():
        with rpc.connect(*addr) as fresh:
            t0 = time.perf_counter()
            fresh.get_function("testing.echo")(1)
            return time.perf_counter() - t0

    return {
        "nd.array(4 B) + free": lambda: nd.array(four_bytes, dev),
        "empty + copyfrom 4 B": lambda: sess.empty((1,), "float32", dev).copyfrom(four_bytes),
        "get_function + free": lambda: sess.get_function("testing.echo"),
        KERNEL_CALL: lambda: addone(a, b),
        "time_evaluator(100, 20)": lambda: evaluator(a, b),
        "first get_function+call": first_call,
    }


def tvm_ops(sess, fresh_server: FreshTVMServer, library: str | None) -> dict:
    """The same operations through TVM; ``fresh_server`` is a second TVM server for the fresh sessions."""
    import tvm
    from tvm import rpc as tvm_rpc

    dev = sess.cpu(0)
    four_bytes = np.ones(1, dtype="float32")

    def first_call():
        try:
            with procs.deadline(10, "a new session with Apache TVM's rpc_server"):
                fresh = tvm_rpc.connect(*fresh_server.addr)
        except TimeoutError as exc:  # its server sometimes stops accepting after a session ends
            procs.note(f"{exc}; restarting that server")
            fresh_server.restart()
            fresh = tvm_rpc.connect(*fresh_server.addr)
        t0 = time.perf_counter()
        fresh.get_function("testing.echo")(1)
        elapsed = time.perf_counter() - t0
        del fresh
        return elapsed

    ops = {
        "nd.array(4 B) + free": lambda: tvm.runtime.tensor(four_bytes, dev),
        "empty + copyfrom 4 B": lambda: tvm.runtime.empty((1,), "float32", dev).copyfrom(four_bytes),
        "get_function + free": lambda: sess.get_function("testing.echo"),
        "first get_function+call": first_call,
    }
    if library:
        sess.upload(library, "tvm_addone.so")
        mod = sess.load_module("tvm_addone.so")
        a = tvm.runtime.tensor(np.zeros(ADDONE_ELEMENTS, "float32"), dev)
        b = tvm.runtime.empty((ADDONE_ELEMENTS,), "float32", dev)
        evaluator = mod.time_evaluator("addone", dev, number=100, repeat=20)
        addone = mod.get_function("addone")
        ops[KERNEL_CALL] = lambda: addone(a, b)
        ops["time_evaluator(100, 20)"] = lambda: evaluator(a, b)
    return ops


SELF_TIMED = {"first get_function+call"}  # returns its own time (the connect is not part of it)


def time_ops(contenders: dict[str, dict], calls: int, block: int) -> dict[str, dict[str, list[float]]]:
    """Per operation, samples of each contender, in interleaved blocks (rotating who goes first)."""
    out: dict[str, dict[str, list[float]]] = {}
    names = list(contenders)
    for op in contenders[names[0]]:
        have = [name for name in names if op in contenders[name]]
        n = max(20, calls // 40) if op in SELF_TIMED else max(100, calls // 10)
        step = max(1, min(block, n // 4))
        if op.startswith("time_evaluator"):  # ~0.15 ms a call: 800 calls in blocks of 20 by default
            n, step = max(100, calls // 25), 20
        samples = {name: [] for name in have}
        for name in have:  # warm-up
            for _ in range(min(step, 10)):
                contenders[name][op]()
        for b in range(max(1, n // step)):
            for i in range(len(have)):
                name = have[(b + i) % len(have)]
                fn = contenders[name][op]
                for _ in range(step):
                    if op in SELF_TIMED:
                        samples[name].append(fn())
                    else:
                        t0 = time.perf_counter()
                        fn()
                        samples[name].append(time.perf_counter() - t0)
        out[op] = samples
    return out


FIRST_TRACKER = r"""
import sys, time
if sys.argv[1] == "tvm":
    from tvm import rpc
else:
    from kernelrpc import rpc
t0 = time.perf_counter()
session = rpc.connect_tracker("127.0.0.1", int(sys.argv[2]))
print(time.perf_counter() - t0)
"""


def first_connect_tracker(tvm_available: bool, env, rounds: int) -> dict[str, list[float]]:
    """Seconds of the first ``connect_tracker()`` in a fresh interpreter (after ``from ... import rpc``).

    The interpreters keep compiled bytecode in a cache of their own, as an installed package has
    its ``.pyc`` files (``PYTHONDONTWRITEBYTECODE`` would have them compile every module each time);
    one round before the timed ones fills it."""
    cache = tempfile.mkdtemp(prefix="rpc-bench-pycache-")
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    services = []
    try:
        ours, (_, port) = start([sys.executable, "-m", "kernelrpc.tracker", "--port", "0"],
                                r"listening on (\S+):(\d+)", env)
        services.append(ours)
        ports = {"kernelrpc": port}
        if tvm_available:
            theirs, (_, tport) = start([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                        "--port", "9190", "--port-end", "9290"], r"bind to (\S+):(\d+)")
            services.append(theirs)
            ports["apache-tvm"] = tport
            time.sleep(1.0)  # TVM's tracker prints before it listens
        out = {name: [] for name in ports}
        for round_ in range(rounds + 1):
            for name, p in ports.items():
                run = subprocess.run([sys.executable, "-c", FIRST_TRACKER, "tvm" if name == "apache-tvm" else "ours",
                                      str(p)], capture_output=True, text=True, env=env, timeout=60,
                                     preexec_fn=_pin_server)
                if run.returncode == 0 and round_:
                    out[name].append(float(run.stdout.split()[-1]))
        return out
    finally:
        for proc in services:
            stop(proc)
        shutil.rmtree(cache, ignore_errors=True)


def print_ops(samples: dict[str, dict[str, list[float]]]) -> None:
    print("Small session operations (medians; ratio = kernelrpc / apache-tvm)")
    width = max(28, *(len(op) + 2 for op in samples))
    print(f"{'':{width}}{'kernelrpc us':>14}{'apache-tvm us':>15}{'ratio':>8}")
    for op, per in samples.items():
        ours = statistics.median(per["kernelrpc"]) * 1e6 if per.get("kernelrpc") else None
        theirs = statistics.median(per["apache-tvm"]) * 1e6 if per.get("apache-tvm") else None
        line = f"{op:{width}}{ours:14.1f}" if ours is not None else f"{op:{width}}{'-':>14}"
        line += f"{theirs:15.1f}{ours / theirs:7.2f}x" if theirs and ours else f"{'-':>15}{'':8}"
        print(line)


PLACEMENT = {
    "same": "client and all servers pinned to CPU {client} (no cross-CPU wake-ups; the same for all rows)",
    "split": "client pinned to CPU {client}, all servers to CPU {server} (cross-CPU wake-ups; the same for all rows)",
    "none": "left to the scheduler (placement may differ between rows and runs)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per row (default 20000)")
    parser.add_argument("--block", type=int, default=100, help="calls per interleaved block (default 100)")
    parser.add_argument("--repeat", type=int, default=10, help="copies per size and direction (default 10)")
    parser.add_argument("--copies-only", action="store_true", help="measure the tensor copies only")
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--tracker-rounds", type=int, default=5,
                        help="fresh interpreters timed for the first connect_tracker() row (default 5)")
    parser.add_argument("--pin", choices=("none", "same", "split"), default="same",
                        help="CPU placement of client and servers: as the scheduler likes, all on one "
                             "CPU, or client and servers on different CPUs (cross-CPU wake-ups)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally: stop the servers
    global SERVER_CPUS
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = {cpus[0]}
    if args.pin != "none":
        SERVER_CPUS = client_cpu if args.pin == "same" or len(cpus) == 1 else {cpus[1]}
        os.sched_setaffinity(0, client_cpu)
    placement = PLACEMENT[args.pin].format(client=cpus[0], server=min(SERVER_CPUS or client_cpu))
    env = dict(os.environ, PYTHONPATH=str(SRC))
    if args.copies_only:
        print(f"CPU placement ({args.pin}): {placement}")
        copies_only(args, env)
        return
    services = []
    fresh_tvm = None
    try:
        server, addr = start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level", "WARNING",
                              "--max-sessions", "2"],  # the first-call row opens sessions beside the held one
                             r"listening on (\S+):(\d+)", env)
        services.append(server)
        raw, raw_addr = start([sys.executable, "-c", RAW_SERVER], r"listening on (\S+):(\d+)")
        services.append(raw)
        tvm = None if args.no_tvm else start_tvm()
        if tvm:
            services.append(tvm[0])
            fresh_tvm = FreshTVMServer()
        raw_sock, ping = raw_pinger(raw_addr)
        with raw_sock, rpc.connect(*addr) as sess:
            contenders = {"raw Python TCP": ping, "kernelrpc echo(1)": partial(sess.get_function("testing.echo"), 1)}
            if tvm:
                contenders["apache-tvm echo(1)"] = partial(tvm[1].get_function("testing.echo"), 1)
            rtt, block_ratios = round_trips(contenders, args.calls, args.block)
        with tempfile.TemporaryDirectory() as tmp, rpc.connect(*addr) as sess:
            ops = {"kernelrpc": ours_ops(sess, addr, build_addone(tmp))}
            if tvm:
                ops["apache-tvm"] = tvm_ops(tvm[1], fresh_tvm, build_tvm_addone(tmp))
            op_samples = time_ops(ops, args.calls, args.block)
        op_samples["first connect_tracker()"] = first_connect_tracker(bool(tvm), env, args.tracker_rounds)
        raw_copies, ours = copies(raw_addr, addr, args.repeat)
        tvm_copy = tvm_copies(tvm[1]) if tvm else {}
    finally:
        for proc in services:
            stop(proc)
        if fresh_tvm:
            fresh_tvm.stop()

    nblocks = len(block_ratios)
    print(f"Round trip of a trivial call: {args.calls} calls per row in {nblocks} interleaved blocks of "
          f"{args.block}; raw = {PING_BYTES}-byte TCP ping-pong")
    print(f"CPU placement ({args.pin}): {placement}")
    print(f"{'':24}{'median us':>12}{'p99 us':>10}{'median ratio':>14}{'block ratio p10-p90':>22}")
    raw_med, _ = percentiles(rtt["raw Python TCP"])
    for i, (name, samples) in enumerate(rtt.items()):
        med, p99 = percentiles(samples)
        ratios = [r[i] for r in block_ratios] * (2 if nblocks == 1 else 1)
        deciles = statistics.quantiles(ratios, n=10)
        spread = f"{deciles[0]:.2f}-{deciles[-1]:.2f}x"
        print(f"{name:24}{med:12.1f}{p99:10.1f}{med / raw_med:13.2f}x{spread:>22}")
    print()
    print_ops(op_samples)
    print()
    print_copies(raw_copies, ours, tvm_copy, args.repeat)


def print_copies(raw_copies: dict, ours: dict, tvm_copy: dict, repeat: int) -> None:
    """The copy table: best of the repeats, and kernelrpc's spread (slowest to fastest copy)."""
    print(f"Tensor copy bandwidth ({repeat} copies each on one connection, raw and kernelrpc "
          "alternating; raw = loopback TCP into a preallocated buffer; best, and kernelrpc's "
          "slowest-fastest)")
    print(f"{'':24}{'raw MB/s':>12}{'kernelrpc MB/s':>16}{'ratio':>8}{'kernelrpc spread':>20}"
          + (f"{'tvm MB/s':>12}" if tvm_copy else ""))
    for mode, label in (("up", "host->device"), ("down", "device->host")):
        for mib in SIZES_MIB:
            nbytes = mib << 20
            raw_bw = nbytes / min(raw_copies[(mode, mib)]) / 1e6
            rates = [nbytes / t / 1e6 for t in ours[(mode, mib)]]
            our_bw = max(rates)
            spread = f"{min(rates):.0f}-{max(rates):.0f} ({max(rates) / min(rates):.1f}x)"
            line = f"{label + f' {mib} MiB':24}{raw_bw:12.0f}{our_bw:16.0f}{our_bw / raw_bw:7.0%} {spread:>20}"
            if tvm_copy:
                t = tvm_copy.get((mode, mib))
                line += f"{nbytes / t / 1e6:11.0f}" if t else f"{'-':>11}"
            print(line)


def copies_only(args, env) -> None:
    """``--copies-only``: the copy table alone (a device server and the raw server, no TVM)."""
    services = []
    try:
        server, addr = start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level",
                              "WARNING"], r"listening on (\S+):(\d+)", env)
        services.append(server)
        raw, raw_addr = start([sys.executable, "-c", RAW_SERVER], r"listening on (\S+):(\d+)")
        services.append(raw)
        raw_copies, ours = copies(raw_addr, addr, args.repeat)
    finally:
        for proc in services:
            stop(proc)
    print_copies(raw_copies, ours, {}, args.repeat)

if __name__ == "__main__":
    main()
