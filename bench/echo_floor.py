"""The floor of the trivial call ``echo(1)``: how close a Python client and a Python server can come
to a raw Python TCP ping-pong, next to kernelrpc and Apache TVM, with each side's CPU.

    PYTHONPATH=src python bench/echo_floor.py [--pin same|split] [--blocks B] [--calls C]
                                              [--tree NAME=SRC ...] [--no-tvm]

Rows, each its own client process against its own server, timed in blocks of ``--calls`` calls
taking turns (rotating who goes first), medians of the block medians:

* raw TCP: a 32-byte ping-pong, ``sendall`` and ``recv`` and nothing else on either side.
* Python floor: the frames of ``echo(1)`` (a 28-byte CALL, an 18-byte RETURN) with the least
  Python per message: on the client a callable object that takes the session's lock, checks that
  the call is one int, packs the CALL, sends, reads, checks and unpacks the RETURN; on the server
  a loop that checks and unpacks the CALL, looks the function up and calls it (kernelrpc's
  ``testing.echo``), packs the RETURN. Codec, checks and function call written into the two loops,
  which kernelrpc's layers (session, channel, codec, handler) do not do: what is left between this
  row and raw TCP is the least any Python implementation of the call pays.
* kernelrpc (one row per ``--tree``, default this tree): ``sess.get_function("testing.echo")(1)``.
* apache-tvm: the same through TVM 0.27 (C++ server, Python client over its FFI), when installed.

Beside the wall-clock round trip, each row shows the CPU time per call of the client's thread
(``time.thread_time``) and of the server's whole process tree (``/proc/PID/task/*/schedstat``).
On one CPU (``--pin same``, the default) the round trip is about the sum of both.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

SERVER = r'''
import socket, struct, sys, threading
sys.path.insert(0, sys.argv[1])
from kernelrpc.wire import protocol as P
from kernelrpc.server import registry

CALL = struct.Struct("<11sQBq")          # a whole one-int CALL: fixed bytes, function id, tag, value
CALL_FIXED = P.encode_call(0, (0,))[:11]
INT_TAG = P.encode_call(0, (0,))[19]
RESULT = struct.Struct("<10sq")          # a whole one-int RETURN: fixed bytes, value
RESULT_FIXED = P.encode_result(0)[:10]
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
print("listening on 127.0.0.1:%d" % srv.getsockname()[1], flush=True)

def serve(conn):
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mode, recv, send = conn.recv(1), conn.recv, conn.sendall
    if mode == b"p":                     # raw ping-pong
        while True:
            msg = recv(65536)
            if not msg: break
            send(msg)
    elif mode == b"k":                   # the Python floor of echo(1)
        functions = {7: registry.get("testing.echo")}
        size, unpack, call_fixed, int_tag = CALL.size, CALL.unpack, CALL_FIXED, INT_TAG
        pack, result_fixed = RESULT.pack, RESULT_FIXED
        while True:
            msg = recv(448)
            if not msg: break
            if len(msg) == size:
                fixed, function_id, tag, value = unpack(msg)
                if fixed == call_fixed and tag == int_tag:
                    func = functions.get(function_id)
                    if func is not None:
                        result = func(value)
                        if type(result) is int:
                            send(pack(result_fixed, result))
                            continue
            raise SystemExit("the floor serves one-int calls of function 7 that return an int")
    conn.close()

while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
'''


def client(mode: str, host: str, port: int):
    """The callable one row times, and the pid of the process that serves it (0: the server's)."""
    if mode in ("raw", "floor"):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(b"p" if mode == "raw" else b"k")
        if mode == "raw":
            msg = b"x" * 32

            def ping():
                sock.sendall(msg)
                got = 0
                while got < 32:
                    got += len(sock.recv(65536))
            return ping, 0
        return FloorFunction(sock, 7), 0
    if mode == "kernelrpc":
        from kernelrpc import rpc

        session = rpc.connect(host, port)
        return session.get_function("testing.echo"), session.info["pid"]
    from tvm import rpc as tvm_rpc

    return tvm_rpc.connect(host, port).get_function("testing.echo"), 0


class FloorFunction:
    """A remote function with the least Python per call: one frame, the lock, the checks."""

    def __init__(self, sock: socket.socket, function_id: int) -> None:
        import threading

        from kernelrpc.wire import protocol as P

        self.function_id, self.lock, self.sendall, self.recv = function_id, threading.Lock(), sock.sendall, sock.recv
        self.pack, self.call_fixed = struct.Struct("<11sQBq").pack, P.encode_call(0, (0,))[:11]
        self.int_tag = P.encode_call(0, (0,))[19]
        result = struct.Struct("<10sq")
        self.size, self.unpack, self.result_fixed = result.size, result.unpack, P.encode_result(0)[:10]

    def __call__(self, *args):
        lock = self.lock
        lock.acquire()
        try:
            if len(args) == 1 and type(args[0]) is int:
                self.sendall(self.pack(self.call_fixed, self.function_id, self.int_tag, args[0]))
                reply = self.recv(448)
                if len(reply) == self.size:
                    fixed, value = self.unpack(reply)
                    if fixed == self.result_fixed:
                        return value
            raise RuntimeError("the floor calls with one int and expects a one-int RETURN")
        finally:
            lock.release()


def worker(mode: str, host: str, port: int) -> None:
    """A row's client process: on each line ``n`` on stdin, time n calls; print the median
    nanoseconds of one call and the thread's CPU nanoseconds per call."""
    fn, server_pid = client(mode, host, port)
    for _ in range(1000):
        assert fn(1) == 1 if mode != "raw" else fn() is None
    print(server_pid, flush=True)
    call = (lambda: fn(1)) if mode != "raw" else fn
    clock, cpu = time.perf_counter, time.thread_time
    for line in sys.stdin:
        n = int(line)
        samples = [0.0] * n
        c0 = cpu()
        for i in range(n):
            t0 = clock()
            call()
            samples[i] = clock() - t0
        print(f"{statistics.median(samples) * 1e9:.0f} {(cpu() - c0) / n * 1e9:.0f}", flush=True)


def tree_cpu_ns(pid: int) -> int:
    """CPU nanoseconds of ``pid``'s threads and of all its descendants' (schedstat)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # ended meanwhile
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pin", choices=("same", "split"), default="same",
                        help="clients and servers on one CPU, or clients on one and servers on another")
    parser.add_argument("--blocks", type=int, default=80)
    parser.add_argument("--calls", type=int, default=200, help="calls per block (default 200)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                        help="a kernelrpc row from the source tree SRC (repeatable; default: this tree)")
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "HOST", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, host, port = args.worker
        worker(mode, host, int(port))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally: stop the servers
    cpus = sorted(os.sched_getaffinity(0))
    client_cpus = {cpus[0]}
    server_cpus = client_cpus if args.pin == "same" or len(cpus) == 1 else {cpus[1]}
    os.sched_setaffinity(0, client_cpus)
    trees = [spec.split("=", 1) for spec in args.tree] or [["kernelrpc", str(SRC)]]
    procs: list[subprocess.Popen] = []

    def start(cmd, pattern, cpus, env=None, **kw) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus), **kw)
        procs.append(proc)
        for line in proc.stdout:
            m = re.search(pattern, line)
            if m:
                return proc, int(m.group(1))
        raise RuntimeError(f"{cmd} did not start")

    rows = {}   # name -> (client mode, source tree, port, server pid)
    try:
        base, port = start([sys.executable, "-c", SERVER, str(SRC)], r"listening on \S+:(\d+)", server_cpus)
        rows["raw TCP"] = ("raw", str(SRC), port, base.pid)
        rows["Python floor"] = ("floor", str(SRC), port, base.pid)
        for name, src in trees:
            env = dict(os.environ, PYTHONPATH=src)
            server, port = start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level", "WARNING"],
                                 r"listening on \S+:(\d+)", server_cpus, env)
            rows[name] = ("kernelrpc", src, port, server.pid)
        if not args.no_tvm:
            try:
                import tvm  # noqa: F401
            except ImportError:
                pass
            else:
                server, port = start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                      "--port", "9300", "--port-end", "9400"], r"bind to \S+:(\d+)", server_cpus)
                time.sleep(2.0)  # TVM's server prints its line before it listens
                rows["apache-tvm"] = ("tvm", str(SRC), port, server.pid)
        workers = {}
        for name, (mode, src, port, server_pid) in rows.items():
            env = dict(os.environ, PYTHONPATH=src)
            w = subprocess.Popen([sys.executable, __file__, "--worker", mode, "127.0.0.1", str(port)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                 preexec_fn=lambda: os.sched_setaffinity(0, client_cpus))
            procs.append(w)
            pid = int(w.stdout.readline())
            workers[name] = (w, pid or server_pid)
        names = list(workers)
        got = {name: ([], [], []) for name in names}
        for b in range(args.blocks):
            for i in range(len(names)):
                name = names[(b + i) % len(names)]
                w, server_pid = workers[name]
                s0 = tree_cpu_ns(server_pid)
                w.stdin.write(f"{args.calls}\n")
                w.stdin.flush()
                wall, client_cpu = map(int, w.stdout.readline().split())
                got[name][0].append(wall)
                got[name][1].append(client_cpu)
                got[name][2].append((tree_cpu_ns(server_pid) - s0) / args.calls)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
    raw = statistics.median(got["raw TCP"][0])
    where = "one CPU" if server_cpus == client_cpus else "clients and servers on two CPUs"
    print(f"echo(1) round trip, {args.blocks} blocks of {args.calls} calls per row taking turns, {where}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'':16}{'us':>8}{'ratio':>9}{'client CPU us':>15}{'server CPU us':>15}")
    for name in names:
        wall, client_cpu, server_cpu = (statistics.median(x) / 1e3 for x in got[name])
        print(f"{name:16}{wall:8.2f}{wall * 1e3 / raw:8.3f}x{client_cpu:15.2f}{server_cpu:15.2f}")


if __name__ == "__main__":
    main()
