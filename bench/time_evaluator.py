"""The whole remote ``time_evaluator(number=100, repeat=20)`` call of a 1-element kernel, with
where its time goes: the client's and the server's CPU time per call, measured in the same run.

    PYTHONPATH=src python bench/time_evaluator.py [--compare OTHER/src] [--no-tvm]
                                                  [--blocks N] [--block B] [--cpu C]
                                                  [--server-cpu S] [--in-process]

Each contender (this tree, ``--compare``'s tree, Apache TVM 0.27 when installed) is a client
process with a device server of its own, all pinned to one CPU (``--cpu``): the call is serial,
so its time is the client's CPU time plus the server's plus the switches between them. With
``--server-cpu`` the servers run on that CPU instead (client and server on two CPUs). The
contenders take turns in blocks of ``--block`` calls (rotating who goes first), so bursts of
load from other processes fall on all alike. Per contender the table shows the median and the
10th/90th percentiles of the calls, and the median over blocks of the CPU time per call of the
client and of the server's processes (their ``schedstat`` run time, in nanoseconds).

``--in-process`` measures instead what the device conditions cost: the call on the module loaded
in a process of each tree, alternating calls with the conditions and without them (a probe
that reads nothing), for three shapes of call.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SRC = BENCH.parent / "src"


def run_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def descendants(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in f.read().split():
                out += [int(child), *descendants(int(child))]
    return out


def contender(kind: str, cpu: int, server_cpu: int, library: str) -> None:
    """A client with a server of its own; answers each block size read from stdin with a JSON
    line of the calls' times and the CPU per call of the client and the server."""
    import numpy as np
    import procs

    os.sched_setaffinity(0, {cpu})
    pin = lambda: os.sched_setaffinity(0, {server_cpu})  # noqa: E731
    if kind == "tvm":
        import tvm
        from tvm import rpc as tvm_rpc

        server, addr = procs.start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                                    "--port", "9300", "--port-end", "9400"], r"bind to (\S+):(\d+)",
                                   preexec_fn=pin)
        deadline = time.monotonic() + 20
        while True:  # TVM's server prints its "bind to" line before it listens
            try:
                sess = tvm_rpc.connect(*addr)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        dev = sess.cpu(0)
        array = tvm.runtime.tensor
    else:
        from kernelrpc import nd, rpc

        server, addr = procs.start([sys.executable, "-m", "kernelrpc.server", "--port", "0",
                                    "--log-level", "WARNING"], r"listening on (\S+):(\d+)", preexec_fn=pin)
        sess = rpc.connect(*addr)
        dev = sess.cpu(0)
        array = nd.array
    try:
        name = os.path.basename(library)
        sess.upload(library, name)
        mod = sess.load_module(name)
        a, b = array(np.zeros(1, "float32"), dev), array(np.zeros(1, "float32"), dev)
        evaluator = mod.time_evaluator("addone", dev, number=100, repeat=20)
        evaluator(a, b)
        print("ready", flush=True)
        for line in sys.stdin:
            servers = [server.pid, *descendants(server.pid)]
            client0, server0 = run_ns(os.getpid()), sum(map(run_ns, servers))
            times, kernel = [], []
            for _ in range(int(line)):
                t0 = time.perf_counter_ns()
                result = evaluator(a, b)
                times.append(time.perf_counter_ns() - t0)
                kernel.append(result.median if hasattr(result, "median") else result.mean)
            client1, server1 = run_ns(os.getpid()), sum(map(run_ns, servers))
            n = len(times)
            print(json.dumps({"times": times, "client": (client1 - client0) / n,
                              "server": (server1 - server0) / n, "kernel": kernel}), flush=True)
    finally:
        procs.stop(server)


IN_PROCESS_SHAPES = ((1, 1), (1, 100), (100, 20))   # number, repeat


class _NoMeasurement:
    def batch_started(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def report(self) -> None:
        return None


class _NoProbe:
    def measurement(self) -> _NoMeasurement:
        return _NoMeasurement()


def in_process(library: str, calls: int = 3000) -> None:
    """Median microseconds per call with and without the conditions, as one JSON line."""
    import numpy as np
    from kernelrpc import nd, runtime

    mod = runtime.load_module(library)
    a, b = nd.array(np.zeros(1, "float32")), nd.empty((1,), "float32")
    out = {}
    for number, repeat in IN_PROCESS_SHAPES:
        with_them = mod.time_evaluator("addone", runtime.cpu(0), number=number, repeat=repeat)
        without = mod.time_evaluator("addone", runtime.cpu(0), number=number, repeat=repeat)
        without._probe = _NoProbe()
        times = {"with": [], "without": []}
        for _ in range(calls):
            for name, timer in (("with", with_them), ("without", without)):
                t0 = time.perf_counter_ns()
                timer(a, b)
                times[name].append(time.perf_counter_ns() - t0)
        out[f"{number},{repeat}"] = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", metavar="SRC", help="another tree's src directory, measured alternately")
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block", type=int, default=20, help="calls per block")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument("--server-cpu", type=int, help="the servers' CPU (default: --cpu's)")
    parser.add_argument("--in-process", action="store_true", help="what the device conditions cost")
    parser.add_argument("--contender", nargs=2, metavar=("KIND", "LIBRARY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.server_cpu is None:
        args.server_cpu = args.cpu
    if args.contender:
        sys.path.insert(0, str(BENCH))
        if args.contender[0] == "in-process":
            return in_process(args.contender[1])
        return contender(args.contender[0], args.cpu, args.server_cpu, args.contender[1])

    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(BENCH))
    from rpc import build_addone, build_tvm_addone

    trees = {"this tree": str(SRC)}
    if args.compare:
        trees["--compare"] = str(Path(args.compare).resolve())
    tvm_ok = not args.no_tvm and subprocess.run([sys.executable, "-c", "import tvm"],
                                               capture_output=True).returncode == 0
    if args.in_process:
        with tempfile.TemporaryDirectory() as tmp:
            library = build_addone(tmp)
            print("in-process time_evaluator of a 1-element kernel, median microseconds per call")
            for name, src in trees.items():
                run = subprocess.run([sys.executable, __file__, "--contender", "in-process", library],
                                     capture_output=True, text=True, check=True,
                                     env=dict(os.environ, PYTHONPATH=src))
                got = json.loads(run.stdout.splitlines()[-1])
                print(f"{name:12s} " + "; ".join(
                    f"number={shape.split(',')[0]} repeat={shape.split(',')[1]}: "
                    f"{t['without']:.1f} without the conditions, {t['with']:.1f} with them"
                    for shape, t in got.items()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        ours, theirs = build_addone(tmp), build_tvm_addone(tmp) if tvm_ok else None
        jobs = {name: ("ours", ours, dict(os.environ, PYTHONPATH=src)) for name, src in trees.items()}
        if theirs:
            jobs["apache-tvm 0.27"] = ("tvm", theirs, dict(os.environ))
        workers = {}
        try:
            for name, (kind, library, env) in jobs.items():
                workers[name] = subprocess.Popen(
                    [sys.executable, __file__, "--cpu", str(args.cpu), "--server-cpu",
                     str(args.server_cpu), "--contender", kind, library],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                if workers[name].stdout.readline().strip() != "ready":
                    raise RuntimeError(f"{name} did not start")
            got = {name: {"times": [], "blocks": [], "client": [], "server": [], "kernel": []}
                   for name in workers}
            names = list(workers)
            for b in range(args.blocks):
                for i in range(len(names)):
                    name = names[(b + i) % len(names)]
                    workers[name].stdin.write(f"{args.block}\n")
                    workers[name].stdin.flush()
                    block = json.loads(workers[name].stdout.readline())
                    got[name]["times"] += block["times"]
                    got[name]["blocks"].append(statistics.median(block["times"]))
                    got[name]["kernel"] += block["kernel"]
                    got[name]["client"].append(block["client"])
                    got[name]["server"].append(block["server"])
        finally:
            for worker in workers.values():
                worker.stdin.close()
                worker.wait()
    where = (f"client and server on CPU {args.cpu}" if args.server_cpu == args.cpu
             else f"client on CPU {args.cpu}, server on CPU {args.server_cpu}")
    print(f"whole remote time_evaluator(100, 20) call, 1-element kernel, {where}; "
          f"{args.blocks} blocks of {args.block} calls; microseconds")
    print("(best block: the lowest of the blocks' medians, and the lowest CPU per call of a block; "
          "bursts of load from other processes raise the medians. kernel ns: the median over the "
          "calls of the time each reported per kernel call, which must not depend on the tree)")
    print(f"{'':18s} {'median':>8s} {'p10':>8s} {'p90':>8s} {'best block':>11s} {'client CPU':>11s} "
          f"{'best':>6s} {'server CPU':>11s} {'best':>6s} {'kernel ns':>10s}")
    for name, r in got.items():
        times = sorted(r["times"])
        pick = lambda q: times[int(q * (len(times) - 1))] / 1e3  # noqa: E731
        print(f"{name:18s} {statistics.median(times) / 1e3:8.1f} {pick(0.1):8.1f} {pick(0.9):8.1f} "
              f"{min(r['blocks']) / 1e3:11.1f} "
              f"{statistics.median(r['client']) / 1e3:11.1f} {min(r['client']) / 1e3:6.1f} "
              f"{statistics.median(r['server']) / 1e3:11.1f} {min(r['server']) / 1e3:6.1f} "
              f"{statistics.median(r['kernel']) * 1e9:10.2f}")


if __name__ == "__main__":
    main()
