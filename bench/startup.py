"""Start-up and first-use costs, each next to Apache TVM (when installed) in the same run.

    PYTHONPATH=src python bench/startup.py [--compare OTHER/src] [--samples N] [--no-tvm] [--connect-only]
    PYTHONPATH=src python bench/startup.py --reconnect [--compare OTHER/src] [--cycles N] [--rounds R] [--hold]

Rows (medians over ``--samples`` fresh processes or sessions):

* ``import kernelrpc.rpc`` (``import tvm.rpc``) in a fresh interpreter, and which heavy
  packages (numpy, llvmlite, tqdm) it loaded;
* the first ``connect_tracker()`` in that process, after the import (TVM's import takes
  seconds and loads what its connect needs; kernelrpc's connect loads its own code), and
  import + connect together, and the connect with the first exchange on it (``summary()``);
* ``rpc.connect()`` to a device server (handshake, the server's start of the session child,
  version exchange), the first ``get_function("testing.echo")`` + call on that new session
  (what the session's child does on its first requests), the second pair and the tenth (a new
  session's first requests are all slower than a long session's, on both sides);
* a whole remote ``time_evaluator(number=100, repeat=20)`` call for a 1-element kernel: the first
  in a client process (which loads the client's code for it), the first on each later session
  (what the session's child does the first time), then the steady state; and the same call on
  the module loaded in the client's own process (no RPC: the timing loop, the device conditions
  and the result).

``--compare`` names another tree's ``src`` directory (e.g. the main branch's): its client and
its server are measured too, one fresh client process at a time alternating with this tree's
(and TVM's), the order rotating, so load from other processes falls on all alike. One tracker
(this tree's) serves every row, TVM's included.

``--reconnect``: a client that connects again as soon as its session is closed, on one CPU with
its server, in a table of its own. Each cycle is ``connect()``, ``get_function("testing.echo")(1)``,
close: a tuner's loop that opens a session per measurement. The client and the server (default
options) share one CPU, so the server's work between sessions (the next session child forked, the
last one reaped, a spare warmed up) falls on the same CPU as the client's next session. Printed per
contender: the medians of the whole cycle, the connect and the first call, and the CPU time per
cycle of the server's whole process tree (its session children and spares included) and of the
client, from ``/proc``. Apache TVM's ``rpc_server`` (when installed) is measured the same way. The
contenders (this tree, ``--compare``'s, TVM) take turns, ``--rounds`` times.
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

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))   # this process builds the kernels with this tree's compiler

from procs import note, start, stop  # noqa: E402

# Run in a fresh interpreter per sample: argv = mode, JSON arguments; prints one JSON line.
CLIENT = r'''
import json, sys, time
mode, opts = sys.argv[1], json.loads(sys.argv[2])
out = {}

sessions = []

def close():
    """Our sessions close explicitly (a reference cycle may keep one until the next collection);
    TVM's close when the last reference goes."""
    getattr(sessions.pop(), "close", lambda: None)()
    time.sleep(0.02)   # the server reaps the session child before it takes the next

if mode == "connect":
    t0 = time.perf_counter()
    if opts["tvm"]:
        from tvm import rpc
    else:
        from kernelrpc import rpc
    t1 = time.perf_counter()
    session = rpc.connect_tracker(*opts["tracker"])
    t2 = time.perf_counter()
    session.summary()
    t3 = time.perf_counter()
    out = {"import": t1 - t0, "connect": t2 - t1, "summary": t3 - t2,
           "heavy": sorted(m for m in ("numpy", "llvmlite", "tqdm") if m in sys.modules)}
elif mode == "session":
    if opts["tvm"]:
        from tvm import rpc
    else:
        from kernelrpc import rpc
    sessions.append(rpc.connect(*opts["server"]))
    sessions[-1].get_function("testing.echo")(1)  # the process's own first use
    close()
    connects, calls = [], [[] for _ in range(10)]
    for _ in range(opts["n"]):
        t0 = time.perf_counter()
        sess = rpc.connect(*opts["server"])
        connects.append(time.perf_counter() - t0)
        sessions.append(sess)
        for into in calls:
            t0 = time.perf_counter()
            sess.get_function("testing.echo")(1)
            into.append(time.perf_counter() - t0)
        del sess    # before the next connect: TVM's server serves one session at a time
        close()
    out = {"connect": connects, "first": calls[0], "second": calls[1], "tenth": calls[9]}
elif mode == "evaluator":
    import numpy as np
    if opts["tvm"]:
        import tvm
        from tvm import rpc
        array = lambda a, dev: tvm.runtime.tensor(a, dev)
    else:
        from kernelrpc import nd, rpc
        array = nd.array
    first, steady = [], []
    for _ in range(opts["n"]):
        sess = rpc.connect(*opts["server"])
        sessions.append(sess)
        sess.upload(opts["lib"])
        mod = sess.load_module(opts["lib"].rsplit("/", 1)[1])
        dev = sess.cpu(0)
        a = array(np.zeros(1, "float32"), dev)
        b = array(np.zeros(1, "float32"), dev)
        timer = mod.time_evaluator("addone", dev, number=100, repeat=20)
        for i in range(opts["calls"] + 1):
            t0 = time.perf_counter()
            timer(a, b)
            (first if i == 0 else steady).append(time.perf_counter() - t0)
        del timer, a, b, dev, mod, sess
        close()
    if opts["tvm"]:
        local = tvm.runtime.load_module(opts["lib"])
        dev = tvm.cpu(0)
    else:
        from kernelrpc import runtime
        local = runtime.load_module(opts["lib"])
        dev = runtime.cpu(0)
    a, b = array(np.zeros(1, "float32"), dev), array(np.zeros(1, "float32"), dev)
    timer = local.time_evaluator("addone", dev, number=100, repeat=20)
    timer(a, b)
    in_process = []
    for i in range(opts["calls"] * 5):
        t0 = time.perf_counter()
        timer(a, b)
        in_process.append(time.perf_counter() - t0)
    out = {"process_first": first[0], "first": first[1:], "steady": steady, "local": in_process}
print(json.dumps(out), flush=True)
'''


PYCACHE = os.path.join(tempfile.gettempdir(), "kernelrpc-bench-startup-pyc")


def env_for(src: str | None) -> dict:
    """Children compile to bytecode once, into PYCACHE (not the trees), as an installed package
    would: ``PYTHONDONTWRITEBYTECODE`` would have them compile every module on every import."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPYCACHEPREFIX=PYCACHE)
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    if src is not None:
        env["PYTHONPATH"] = src
    return env


def client(mode: str, env: dict, **opts) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT, mode, json.dumps(opts)], env=env,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} client failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_kernels(tmp: str, tvm_too: bool) -> dict[str, str]:
    """B[0] = A[0] + 1 over float32[1], built by kernelrpc (and by TVM for its server)."""
    import kernelrpc
    from kernelrpc import te
    a = te.placeholder((1,), name="A")
    b = te.compute((1,), lambda i: a[i] + 1.0, name="B")
    libs = {"kernelrpc": os.path.join(tmp, "addone1.so")}
    kernelrpc.build(te.create_schedule(b.op), [a, b], name="addone").export_library(libs["kernelrpc"])
    if tvm_too:
        import tvm
        from tvm import te as tvm_te
        ta = tvm_te.placeholder((1,), "float32", "A")
        tb = tvm_te.compute((1,), lambda i: ta[i] + 1.0, name="B")
        func = tvm_te.create_prim_func([ta, tb]).with_attr("global_symbol", "addone")
        libs["tvm"] = os.path.join(tmp, "addone1_tvm.so")
        tvm.compile(func, target="llvm").export_library(libs["tvm"])
    return libs


def ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:9.3f} ms" if samples else f"{'-':>12}"


# --reconnect: a client process, pinned with its server, that connects again at once;
# argv = cycles, port, server pid, "tvm" or "ours", "hold" or "-"; prints one JSON line.
RECONNECT_CLIENT = r"""
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


def start_pinned_server(name: str, src: str | None, cpu: int, hold: bool):
    pin = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731
    if name.startswith("apache-tvm"):
        return start([sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", "9300",
                      "--port-end", "9400"], r"bind to (\S+):(\d+)", preexec_fn=pin)
    env = dict(os.environ, PYTHONPATH=src)
    return start([sys.executable, "-m", "kernelrpc.server", "--port", "0", "--log-level", "WARNING",
                  "--max-sessions", "2" if hold else "1"], r"listening on (\S+):(\d+)", env=env, preexec_fn=pin)


def reconnect_round(name: str, src: str | None, cycles: int, cpu: int, hold: bool) -> dict:
    proc, (_, port) = start_pinned_server(name, src, cpu, hold)
    tvm = name.startswith("apache-tvm")
    try:
        if tvm:
            time.sleep(1.0)                         # TVM's server prints its line before it listens
        env = dict(os.environ, PYTHONPATH=src or str(SRC))   # TVM's client too: the CPU count is kernelrpc's
        done = subprocess.run([sys.executable, "-c", RECONNECT_CLIENT, str(cycles), str(port), str(proc.pid),
                               "tvm" if tvm else "ours", "hold" if hold and not tvm else "-"],
                              capture_output=True, text=True, env=env, timeout=600,
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        if done.returncode != 0:
            raise RuntimeError(f"{name}: the client failed:\n{done.stderr}")
        return json.loads(done.stdout.splitlines()[-1])
    finally:
        stop(proc)



def run_reconnect(args) -> None:
    """The --reconnect table."""
    contenders = {"kernelrpc": str(SRC)}
    if args.compare:
        contenders["kernelrpc (compare)"] = os.path.abspath(args.compare)
    if not args.no_tvm:
        try:
            import tvm.rpc  # noqa: F401
            contenders["apache-tvm"] = None
        except ImportError:
            note("apache-tvm is not installed: its row is left out")
    cpu = min(os.sched_getaffinity(0))
    results: dict[str, list[dict]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        names = list(contenders)
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(reconnect_round(name, contenders[name], args.cycles, cpu, args.hold))

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



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", metavar="SRC", help="another tree's src directory, measured alternately")
    parser.add_argument("--samples", type=int, default=15, help="fresh processes per connect row")
    parser.add_argument("--sessions", type=int, default=30, help="sessions per session row")
    parser.add_argument("--evaluator-sessions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3,
                        help="client processes per contender for the session rows (--reconnect: rounds)")
    parser.add_argument("--no-tvm", action="store_true")
    parser.add_argument("--connect-only", action="store_true",
                        help="only the import and connect_tracker() rows (no servers, no kernels)")
    parser.add_argument("--reconnect", action="store_true",
                        help="only the table of a client that connects again at once")
    parser.add_argument("--cycles", type=int, default=200, help="--reconnect: cycles per round (default 200)")
    parser.add_argument("--hold", action="store_true",
                        help="--reconnect: kernelrpc's servers serve two sessions at once, and the client holds "
                             "one open meanwhile, as bench/rpc.py's first-call row does (TVM serves one at a time)")
    args = parser.parse_args()
    (run_reconnect if args.reconnect else run_startup)(args)


def run_startup(args) -> None:
    """The start-up and first-use table."""
    tvm_ok = not args.no_tvm and subprocess.run([sys.executable, "-c", "import tvm"],
                                               capture_output=True).returncode == 0
    trees = {"kernelrpc (this tree)": str(SRC)}
    if args.compare:
        trees["kernelrpc (--compare)"] = str(Path(args.compare).resolve())
    contenders = {name: (env_for(src), False) for name, src in trees.items()}
    if tvm_ok:
        contenders["apache-tvm"] = (env_for(None), True)

    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            tproc, tracker = start([sys.executable, "-m", "kernelrpc.tracker", "--port", "0"],
                                   r"listening on (\S+):(\d+)", env_for(str(SRC)))
            procs.append(tproc)
            servers = {}
            for name, (env, is_tvm) in ({} if args.connect_only else contenders).items():
                if is_tvm:
                    cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1",
                           "--port", "9400", "--port-end", "9500"]
                    proc, addr = start(cmd, r"bind to (\S+):(\d+)", env)
                    time.sleep(1.0)  # TVM prints its "bind to" line before it listens
                else:
                    proc, addr = start([sys.executable, "-m", "kernelrpc.server", "--port", "0"],
                                       r"listening on (\S+):(\d+)", env)
                procs.append(proc)
                servers[name] = list(addr)
            libs = {} if args.connect_only else build_kernels(tmp, tvm_ok)

            rows: dict[str, dict[str, list[float]]] = {}
            heavy: dict[str, list[str]] = {}

            def add(row: str, name: str, values) -> None:
                rows.setdefault(row, {}).setdefault(name, []).extend(
                    values if isinstance(values, list) else [values])

            for name, (env, is_tvm) in contenders.items():     # writes the bytecode caches
                client("connect", env, tvm=is_tvm, tracker=list(tracker))
            def rotated(i: int) -> list[str]:
                """The contenders, starting with a different one each time."""
                names = list(contenders)
                return names[i % len(names):] + names[:i % len(names)]

            for i in range(args.samples):
                for name in rotated(i):
                    env, is_tvm = contenders[name]
                    out = client("connect", env, tvm=is_tvm, tracker=list(tracker))
                    add("import the rpc package", name, out["import"])
                    add("first connect_tracker() in a process", name, out["connect"])
                    add("import + first connect_tracker()", name, out["import"] + out["connect"])
                    add("first connect_tracker() + its first summary()", name, out["connect"] + out["summary"])
                    heavy[name] = out["heavy"]
            for round_ in range(0 if args.connect_only else args.rounds):
                for name in rotated(round_):
                    env, is_tvm = contenders[name]
                    out = client("session", env, tvm=is_tvm, server=servers[name],
                                 n=max(1, args.sessions // args.rounds))
                    add("rpc.connect() to the server (a new session)", name, out["connect"])
                    add("first get_function + call on a new session", name, out["first"])
                    add("the same again: the second on that session", name, out["second"])
                    add("the same: the tenth on that session", name, out["tenth"])
            for round_ in range(0 if args.connect_only else args.rounds):
                for name in rotated(round_):
                    env, is_tvm = contenders[name]
                    lib = libs["tvm" if is_tvm else "kernelrpc"]
                    out = client("evaluator", env, tvm=is_tvm, server=servers[name], lib=lib,
                                 n=max(2, args.evaluator_sessions // args.rounds), calls=20)
                    add("time_evaluator(100, 20), first in a process", name, out["process_first"])
                    add("time_evaluator(100, 20), first on a later session", name, out["first"])
                    add("time_evaluator(100, 20), steady", name, out["steady"])
                    add("time_evaluator(100, 20), in-process module", name, out["local"])
        finally:
            for proc in procs:
                stop(proc)

    names = list(contenders)
    width = max(len(r) for r in rows) + 2
    print(f"\n{'median of fresh processes / sessions':<{width}}" + "".join(f"{n:>24}" for n in names))
    for row, by_name in rows.items():
        print(f"{row:<{width}}" + "".join(f"{ms(by_name.get(n, [])):>24}" for n in names))
    print("\nheavy packages loaded by the import + connect: "
          + "; ".join(f"{n}: {', '.join(heavy[n]) or 'none'}" for n in names))


if __name__ == "__main__":
    main()
