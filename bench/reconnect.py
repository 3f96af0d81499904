"""A client that connects again as soon as its session is closed, on one CPU with its server.

    PYTHONPATH=src python bench/reconnect.py [--compare OTHER/src] [--cycles N] [--rounds R] [--hold] [--no-tvm]

Each cycle is ``connect()``, ``get_function("testing.echo")(1)``, close: a tuner's loop that
opens a session per measurement. The client and the server (default options) share one CPU,
so the server's work between sessions (the next session child forked, the last one reaped,
a spare warmed up) falls on the same CPU as the client's next session. Printed per contender:
the medians of the whole cycle, the connect and the first call, and the CPU time per cycle of
the server's whole process tree (its session children and spares included) and of the client,
from ``/proc``. Apache TVM's ``rpc_server`` (when installed) is measured the same way.

``--compare`` names another tree's ``src`` directory: its server and client are measured too.
Contenders take turns, ``--rounds`` times, so load from other processes falls on all alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import procs  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"

CLIENT = r"""
import json, os, sys, time
cycles, port, server_pid, kind, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
from kernelrpc.server.process_tree import descendants
if kind == "tvm":
    from tvm import rpc
else:
    from kernelrpc import rpc
held = rpc.connect("127.0.0.1", port) if hold == "hold" else None

def server_ticks():   # the server's process tree alive now (TVM serves from a child), with what each reaped
    total = 0
    for pid in (server_pid, *descendants(server_pid)):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:     # it ended meanwhile: its parent counts it once it is reaped
            continue
        total += sum(map(int, fields[11:15]))
    return total

def one_cycle():
    t0 = time.perf_counter()
    sess = rpc.connect("127.0.0.1", port)
    t1 = time.perf_counter()
    sess.get_function("testing.echo")(1)
    t2 = time.perf_counter()
    if kind == "tvm":
        del sess                                    # TVM closes the session when it is freed
    else:
        sess.close()
    return t1 - t0, t2 - t1, time.perf_counter() - t0

for _ in range(5):
    one_cycle()
server0 = server_ticks()
cpu0 = time.process_time()
samples = [one_cycle() for _ in range(cycles)]
cpu1 = time.process_time()
time.sleep(0.5)                                     # the last session's child is reaped meanwhile
server1 = server_ticks()
tick = os.sysconf("SC_CLK_TCK")
print(json.dumps({"connect": [s[0] for s in samples], "first": [s[1] for s in samples],
                  "cycle": [s[2] for s in samples], "server": (server1 - server0) / tick / cycles,
                  "client": (cpu1 - cpu0) / cycles}))
"""


def start_server(name: str, src: str | None, cpu: int, hold: bool):
    pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
    if name.startswith("apache-tvm"):
        return procs.start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", "9300",
                            "--port-end", "9400"], r"bind to (\S+):(\d+)", preexec_fn=pin)
    env = dict(os.environ, PYTHONPATH=src)
    return procs.start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level", "WARNING",
                        "--max-sessions", "2" if hold else "1"], r"listening on (\S+):(\d+)", env=env, preexec_fn=pin)


def run_round(name: str, src: str | None, cycles: int, cpu: int, hold: bool) -> dict:
    proc, (_, port) = start_server(name, src, cpu, hold)
    tvm = name.startswith("apache-tvm")
    try:
        if tvm:
            time.sleep(1.0)                         # TVM's server prints its line before it listens
        env = dict(os.environ, PYTHONPATH=src or str(SRC))   # TVM's client too: the CPU count is kernelrpc's
        done = subprocess.run([sys.executable, "-c", CLIENT, str(cycles), str(port), str(proc.pid),
                               "tvm" if tvm else "ours", "hold" if hold and not tvm else "-"],
                              capture_output=True, text=True, env=env, timeout=600,
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        if done.returncode != 0:
            raise RuntimeError(f"{name}: the client failed:\n{done.stderr}")
        return json.loads(done.stdout.splitlines()[-1])
    finally:
        procs.stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", metavar="SRC", help="another tree's src directory, measured in turn")
    parser.add_argument("--cycles", type=int, default=200, help="cycles per round (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender (default 3)")
    parser.add_argument("--hold", action="store_true",
                        help="kernelrpc's servers serve two sessions at once, and the client holds one open "
                             "meanwhile, as bench/rpc.py's first-call row does (TVM serves one at a time)")
    parser.add_argument("--no-tvm", action="store_true")
    args = parser.parse_args()
    contenders = {"kernelrpc": str(SRC)}
    if args.compare:
        contenders["kernelrpc (compare)"] = os.path.abspath(args.compare)
    if not args.no_tvm:
        try:
            import tvm.rpc  # noqa: F401
            contenders["apache-tvm"] = None
        except ImportError:
            procs.note("apache-tvm is not installed: its row is left out")
    cpu = min(os.sched_getaffinity(0))
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        names = list(contenders)
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(run_round(name, contenders[name], args.cycles, cpu, args.hold))

    print(f"A client that connects again at once: {args.rounds} rounds of {args.cycles} cycles per contender, "
          f"client and server on CPU {cpu}" + (", another session held open (kernelrpc)" if args.hold else ""))
    print(f"{'':22}{'cycle ms':>10}{'connect ms':>12}{'first call us':>15}{'server CPU ms':>15}{'client CPU ms':>15}")
    for name, rounds in results.items():
        med = lambda key: statistics.median(x for one in rounds for x in one[key])  # noqa: E731
        per = lambda key: statistics.median(one[key] for one in rounds)  # noqa: E731
        print(f"{name:22}{med('cycle') * 1e3:10.2f}{med('connect') * 1e3:12.2f}{med('first') * 1e6:15.0f}"
              f"{per('server') * 1e3:15.2f}{per('client') * 1e3:15.2f}")
    print("(CPU columns: per cycle, the median of the rounds; server = its whole process tree: session "
          "children, spares)")


if __name__ == "__main__":
    main()
