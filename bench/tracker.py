"""Tracker benchmark: kernelrpc's tracker side by side with Apache TVM's, in one run.

    python bench/tracker.py [--servers 200] [--clients 100] [--requests 2000] [--bursts 3]
                            [--rates 1000,5000,10000] [--no-tvm] [--no-floor]

Each tracker runs as users start it (``python -m ...``); the load comes from a
separate process (``bench/tracker_load.py``: raw non-blocking sockets, one
``selectors`` loop, pre-encoded frames) so that the two share the machine's CPUs
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
against ``bench/tracker_floor.py``, the least a Python tracker can do per message.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"


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


def run_load(addr, tracker_pid: int, args) -> dict:
    argv = [sys.executable, str(BENCH / "tracker_load.py"), addr[0], str(addr[1]), str(tracker_pid),
            "--servers", str(args.servers), "--clients", str(args.clients), "--requests", str(args.requests),
            "--bursts", str(args.bursts), "--rates", ",".join(str(r) for r in args.rates)]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(argv, ready, args) -> dict:
    proc, addr, ready_s = start(argv, ready)
    try:
        result = run_load(addr, proc.pid, args)
    finally:
        stop(proc)
    readies = [ready_s]
    for _ in range(2):
        proc, _, ready_s = start(argv, ready)
        stop(proc)
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
    parser.add_argument("--no-floor", action="store_true", help="skip the run against bench/tracker_floor.py")
    args = parser.parse_args()

    ours = measure(["-m", "kernelrpc.tracker", "--port", "0", "--log-level", "WARNING"],
                   r"kernelrpc\.tracker listening on (\S+):(\d+)", args)
    theirs = None
    if not args.no_tvm and tvm_available():
        port = free_port()
        theirs = measure(["-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                          "--port-end", str(port + 100)], r"bind to (\S+):(\d+)", args)
    floor = None if args.no_floor else measure([str(BENCH / "tracker_floor.py")],
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
        print("floor: bench/tracker_floor.py, a raw selectors loop that only decodes, matches first-in first-out "
              "and replies (no validation): the most this machine and load generator allow a Python tracker")
    if theirs is None:
        print("(apache-tvm not installed or --no-tvm: no reference column)")
    else:
        print("ratio: how many times better kernelrpc is (throughput ours/TVM, times TVM/ours)")


if __name__ == "__main__":
    main()
