"""Soak: a small fleet under random faults for a few minutes; does every job still get done?

    python bench/soak.py [--servers 4] [--clients 8] [--duration 180] [--seed 1]

Starts a tracker and ``--servers`` device servers as users do (``python -m ...``), and
``--clients`` client threads that each repeat one *job*: ``request()`` a server from the
tracker, call ``testing.echo``, upload and download 64 KiB, close. A job that fails with a
typed error (any ``RPCError``) is retried until it succeeds or its 60 s run out (then it is
*lost*). Meanwhile, every 1-3 s, one fault at random:

* kill -9 of a running session child (the client sees ``ServerCrashed``),
* kill -9 of a server, restarted 0.5 s later,
* a tracker restart (SIGTERM, started again on the same port),
* 50 garbage connections to the tracker and to a server (random bytes, or silent),
* a kernel that leaves a daemon behind (a process in a session of its own, orphaned at
  once), then its session ends: closed, its child killed with -9, or its server killed
  with -9 (and restarted); the daemon must be gone within 5 s.

Reported: jobs done and lost, typed errors by type, how long the failing call took
to raise (typed-error latency), time to heal (from a server kill or tracker restart to
every server registered again), daemons left running, the resident memory of the tracker
and of each server (the first process at the start, the last one at the end, and how often
it was restarted), and the processes of the run (servers, session children, daemons) still
alive 10 s after it ended (goal 0).
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from kernelrpc import nd                                                # noqa: E402
from kernelrpc.errors import RPCError                                    # noqa: E402
from kernelrpc.deploy.launch import Service                                    # noqa: E402
from kernelrpc.rpc.tracker_client import connect_tracker                # noqa: E402
from kernelrpc.server.process_tree import children                       # noqa: E402

JOB_DEADLINE = 60.0
PAYLOAD = os.urandom(64 << 10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return float("nan")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except OSError:
        return False


class Fleet:
    def __init__(self, servers: int) -> None:
        self.port = free_port()
        self.tracker = self._start_tracker()
        self.servers = [self._start_server() for _ in range(servers)]
        self.restarts = [0] * servers

    def restart_server(self, index: int) -> None:
        """kill -9 of server ``index``, and a new one 0.5 s later."""
        os.kill(self.servers[index].proc.pid, signal.SIGKILL)
        self.servers[index].stop()
        time.sleep(0.5)
        self.servers[index] = self._start_server()
        self.restarts[index] += 1

    def _start_tracker(self) -> Service:
        return Service("kernelrpc.tracker", ["--port", str(self.port), "--port-end", str(self.port + 1),
                                             "--log-level", "WARNING"])

    def _start_server(self) -> Service:
        return Service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{self.port}", "--key", "soak",
                                            "--log-level", "WARNING"])

    def registered(self) -> int:
        """Servers registered at the tracker under the key (free or in a session)."""
        try:
            with connect_tracker("127.0.0.1", self.port, connect_timeout=2) as t:
                return sum(info.get("key") == "server:soak" for info in t.summary()["server_info"])
        except (RPCError, OSError):
            return -1

    def stop(self) -> None:
        for svc in [*self.servers, self.tracker]:
            svc.stop()


def client_loop(fleet: Fleet, stop: threading.Event, stats: dict, lock: threading.Lock) -> None:
    while not stop.is_set():
        started = time.monotonic()
        done = False
        while not done and time.monotonic() - started < JOB_DEADLINE and not stop.is_set():
            call_started = time.monotonic()
            try:
                with connect_tracker("127.0.0.1", fleet.port, connect_timeout=5) as tracker:
                    remaining = JOB_DEADLINE - (time.monotonic() - started)
                    with tracker.request("soak", timeout=max(1.0, remaining), session_timeout=30) as sess:
                        assert sess.get_function("testing.echo")(7) == 7
                        sess.upload(PAYLOAD, "p.bin")
                        assert sess.download("p.bin") == PAYLOAD
                done = True
            except RPCError as exc:
                with lock:
                    stats["errors"][type(exc).__name__] += 1
                    stats["examples"].setdefault(type(exc).__name__, str(exc)[:160])
                    stats["error_latency"].append(time.monotonic() - call_started)
                stop.wait(0.05)
            except Exception as exc:            # not typed: counted apart, the job goes on
                with lock:
                    stats["untyped"][f"{type(exc).__name__}: {exc}"[:120]] += 1
                stop.wait(0.05)
        with lock:
            if done:
                stats["done"] += 1
            elif not stop.is_set():
                stats["lost"] += 1


def garbage(addr: tuple[str, int], rng: random.Random) -> None:
    socks = []
    for _ in range(50):
        try:
            s = socket.create_connection(addr, timeout=2)
            if rng.random() < 0.5:
                s.sendall(os.urandom(rng.randint(1, 2000)))
            socks.append(s)
        except OSError:
            pass
    threading.Timer(rng.uniform(0.5, 5.0), lambda: [s.close() for s in socks]).start()


def daemon_fault(fleet: Fleet, library: Path, rng: random.Random) -> tuple[str, float | None]:
    """A kernel leaves a daemon behind, then its session ends one of three ways; returns how,
    and how long the daemon outlived that end (None: still running after 5 s)."""
    how = rng.choice(["session closed", "session child killed", "server killed"])
    with connect_tracker("127.0.0.1", fleet.port, connect_timeout=5) as tracker:
        sess = tracker.request("soak", timeout=30, session_timeout=30)
    try:
        sess.upload(library.read_bytes(), "forking.so")
        out = nd.empty((1,), "int64", sess.cpu(0))
        sess.load_module("forking.so")["spawn_detached"](out)
        daemon = int(out.numpy()[0])
        port = sess._conn.sock.getpeername()[1]
        index = next((i for i, srv in enumerate(fleet.servers) if srv.port == port), None)
        if how == "server killed" and index is None:
            how = "session closed"          # reached through another address: end it the plain way
        ended = time.monotonic()
        if how == "session child killed":
            os.kill(sess.info["pid"], signal.SIGKILL)
        elif how == "server killed":
            os.kill(fleet.servers[index].proc.pid, signal.SIGKILL)
    finally:
        sess.close()
    if how == "session closed":
        ended = time.monotonic()
    outlived = None
    while time.monotonic() - ended < 5.0:
        if not alive(daemon):
            outlived = time.monotonic() - ended
            break
        time.sleep(0.002)
    else:
        os.kill(daemon, signal.SIGKILL)
    if how == "server killed":
        fleet.restart_server(index)
    return how, outlived


def leftovers(marker: str) -> list[int]:
    """Processes still running whose command line names ``marker`` (the soak's tracker port):
    servers and session children of this run that outlived it."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def heal_time(fleet: Fleet, want: int, since: float, deadline: float = 30.0) -> float | None:
    while time.monotonic() - since < deadline:
        if fleet.registered() >= want:
            return time.monotonic() - since
        time.sleep(0.02)
    return None


def build_daemon_module() -> Path | None:
    try:
        from fixtures.build import compile_module

        source = (ROOT / "tests" / "fixtures" / "forking.c").read_text()
        return compile_module(source, tempfile.mkdtemp(prefix="kernelrpc-soak-"), "forking")
    except (ImportError, OSError, RuntimeError) as exc:
        print(f"no daemon faults: cannot build the forking module ({exc})")
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.getLogger("kernelrpc").setLevel(logging.ERROR)   # the clients' reconnect warnings are expected
    rng = random.Random(args.seed)
    library = build_daemon_module()
    fleet = Fleet(args.servers)
    heal_time(fleet, args.servers, time.monotonic())
    rss_start = [rss_mib(fleet.tracker.proc.pid)] + [rss_mib(s.proc.pid) for s in fleet.servers]
    stats = {"done": 0, "lost": 0, "errors": collections.Counter(), "untyped": collections.Counter(),
             "error_latency": [], "examples": {}}
    lock = threading.Lock()
    stop = threading.Event()
    threads = [threading.Thread(target=client_loop, args=(fleet, stop, stats, lock), daemon=True)
               for _ in range(args.clients)]
    for t in threads:
        t.start()
    faults = collections.Counter()
    heals: dict[str, list[float]] = collections.defaultdict(list)
    daemons: dict[str, list] = collections.defaultdict(list)
    tracker_restarts = 0
    kinds = ["session", "session", "server", "tracker", "garbage"] + (["daemon"] if library else [])
    end = time.monotonic() + args.duration
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(1.0, 3.0))
            fault = rng.choice(kinds)
            faults[fault] += 1
            injected = time.monotonic()
            if fault == "session":
                kids = [k for s in fleet.servers for k in children(s.proc.pid)]
                if kids:
                    os.kill(rng.choice(kids), signal.SIGKILL)
            elif fault == "server":
                fleet.restart_server(rng.randrange(len(fleet.servers)))
            elif fault == "tracker":
                fleet.tracker.stop()
                fleet.tracker = fleet._start_tracker()
                tracker_restarts += 1
            elif fault == "daemon":
                try:
                    how, outlived = daemon_fault(fleet, library, rng)
                    daemons[how].append(outlived)
                    if how == "server killed":
                        heal_time(fleet, len(fleet.servers), injected)
                except (RPCError, OSError) as exc:     # another fault got in the way
                    daemons["not started"].append(str(exc)[:80])
            else:
                garbage(fleet.tracker.address, rng)
                garbage(rng.choice(fleet.servers).address, rng)
            if fault in ("server", "tracker"):
                took = heal_time(fleet, len(fleet.servers), injected)
                heals[fault].append(float("inf") if took is None else took)
    finally:
        stop.set()
        for t in threads:
            t.join(JOB_DEADLINE + 10)
    rss_end = [rss_mib(fleet.tracker.proc.pid)] + [rss_mib(s.proc.pid) for s in fleet.servers]
    fleet.stop()
    marker = f"127.0.0.1:{fleet.port}"
    left = leftovers(marker)
    deadline = time.monotonic() + 10
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(marker)

    print(f"soak: {args.servers} servers, {args.clients} clients, {args.duration:g} s, seed {args.seed}")
    print(f"faults injected: {dict(faults)}")
    print(f"jobs done {stats['done']}, lost {stats['lost']} (goal 0)")
    print(f"typed errors (retried): {dict(stats['errors'])}")
    for name, example in sorted(stats["examples"].items()):
        print(f"  e.g. {name}: {example}")
    if stats["untyped"]:
        print(f"UNTYPED errors: {dict(stats['untyped'])}")
    lat = sorted(stats["error_latency"])
    if lat:
        print(f"typed-error latency: median {statistics.median(lat) * 1000:.1f} ms, "
              f"p90 {lat[int(0.9 * (len(lat) - 1))] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms")
    for fault, times in sorted(heals.items()):
        print(f"time until every server is registered again after a {fault} fault: "
              f"median {statistics.median(times):.2f} s, max {max(times):.2f} s ({len(times)} faults)")
    daemons_left = 0
    for how, outlived in sorted(daemons.items()):
        if how == "not started":
            print(f"daemon faults not started (another fault in the way): {len(outlived)}")
            continue
        gone = sorted(t for t in outlived if t is not None)
        daemons_left += len(outlived) - len(gone)
        figure = (f", gone after median {statistics.median(gone) * 1000:.0f} ms, max {gone[-1] * 1000:.0f} ms"
                  if gone else "")
        print(f"kernel daemons, {how}: {len(outlived)}, still running after 5 s: {len(outlived) - len(gone)}{figure}")
    print(f"{'service':<12} {'restarts':>8} {'RSS start MiB':>14} {'RSS end MiB':>12}"
          "   (start: the first process, end: the last)")
    restarts = [tracker_restarts] + fleet.restarts
    for i, name in enumerate(["tracker"] + [f"server {n}" for n in range(len(fleet.servers))]):
        print(f"{name:<12} {restarts[i]:>8} {rss_start[i]:>14.1f} {rss_end[i]:>12.1f}")
    print(f"processes of the run left 10 s after the end: {len(left)} {left[:10]}")
    return 0 if stats["lost"] == 0 and not stats["untyped"] and not left and not daemons_left else 1


if __name__ == "__main__":
    sys.exit(main())
