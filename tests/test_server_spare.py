"""The spare session child (server/spare.py): forked and warmed before the client, handed its session."""
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import pytest

import numpy as np

import kernelrpc
from conftest import wait_until
from kernelrpc.server.forker import is_forker
from kernelrpc.server.process_tree import children
from servicectl import gone
from kernelrpc import nd, rpc
from kernelrpc.wire import profile as profile_codec
from kernelrpc.runtime import evaluator
from kernelrpc.runtime.conditions import check_conditions
from kernelrpc.server.spare import decode_handoff, encode_handoff, is_spare

DEVICE_READY = re.compile(r"connected to proxy (\S+):(\d+)")


def start_server(start_service, *extra):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", *extra])


def spare_of(server, other_than=(), ready=True, timeout=20.0):
    """The server's spare child (waited for), once it is not one of ``other_than`` (and, with
    ``ready``, warm: the next session is handed to it)."""
    return wait_until(lambda: next((c for c in children(server.proc.pid)
                                    if is_spare(c, ready) and c not in other_than), None),
                      timeout=timeout, what="a spare session child")


def threads(pid):
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def policies(pid):
    """The scheduling policy of each of the process's threads."""
    found = []
    for tid in threads(pid):
        try:
            found.append(os.sched_getscheduler(tid))
        except OSError:         # the thread ended
            pass
    return found


def catch_warming_spare(server, attempts=30):
    """``(spare, session)``: a spare stopped (SIGSTOP) in the middle of its warm-up, and the open
    session whose handoff forked it. Each attempt opens a session, whose handoff forks the next
    spare, and looks for that spare while its warm-up thread runs (a few milliseconds)."""
    for _ in range(attempts):
        sess = rpc.connect(server.host, server.port, key="dev")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            found = [c for c in children(server.proc.pid) if c != sess.info["pid"]]
            if any(is_spare(c, ready=True) for c in found):
                break                                   # warm already: missed it
            for child in found:
                try:
                    os.kill(child, signal.SIGSTOP)
                except ProcessLookupError:              # an earlier session's child, gone
                    continue
                if os.SCHED_IDLE in policies(child):    # its warm-up thread is there
                    return child, sess
                os.kill(child, signal.SIGCONT)
        sess.close()
    pytest.fail(f"no spare caught warming up in {attempts} sessions")


def minor_faults(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rfind(")") + 2:].split()[7])


def load_fixture(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


# ---------------------------------------------------------------- the handoff message

@pytest.mark.parametrize("timeout, initial", [(None, b""), (2.5, b"early bytes \0\xff"), (1e-3, b"x" * 70000)])
def test_the_handoff_message_round_trips(timeout, initial):
    assert decode_handoff(encode_handoff(timeout, initial)) == (timeout, initial)


def test_a_truncated_or_inconsistent_handoff_is_refused():
    message = encode_handoff(3.0, b"abc")
    negative = encode_handoff(1.0, b"abc")[:4] + bytes.fromhex("000000000000f0bf") + b"abc"   # -1.0
    for bad in (message[:5], message[:-1], message + b"x", negative):
        with pytest.raises(ValueError):
            decode_handoff(bad)


# ---------------------------------------------------------------- sessions through a spare

def test_a_session_is_handed_to_the_spare_forked_before_it(start_service, tmp_path):
    server = start_server(start_service)
    spare = spare_of(server)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["pid"] == spare
        assert not is_spare(spare)                          # a session child like any other now
        assert sess.get_function("testing.echo")(7) == 7
        source = tmp_path / "note.txt"
        source.write_text("mine")
        sess.upload(str(source), "note.txt")
        assert sess.listdir() == ["note.txt"]
    following = spare_of(server, other_than=(spare,))      # the next spare, after that session
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["pid"] == following
        assert sess.listdir() == []                         # a workspace of its own
    wait_until(lambda: gone(spare), what="the first session's child gone")


def first_faults(server, prepare, spare=True):
    """The median, over three new sessions, of the page faults the session child takes running
    what ``prepare(sess)`` returns; with ``spare``, each session first waits for the server's spare."""
    counts = []
    for _ in range(3):
        if spare:
            spare_of(server)
        with rpc.connect(server.host, server.port, key="dev") as sess:
            run = prepare(sess)
            before = minor_faults(sess.info["pid"])
            run()
            counts.append(minor_faults(sess.info["pid"]) - before)
            del run
    return statistics.median(counts)


def compare_first_faults(start_service, prepare):
    """``(with_spare, the server with spares, without_spare)``: first_faults on a server with
    spares and on one without."""
    warm = start_server(start_service)
    return (first_faults(warm, prepare), warm,
            first_faults(start_server(start_service, "--no-spare-session"), prepare, spare=False))


def test_the_spare_takes_its_page_faults_before_the_client_arrives(start_service):
    """The first get_function + call of a spare's session takes far fewer copy-on-write page
    faults than the same in a child forked at connect."""
    def prepare(sess):
        def run():
            assert sess.get_function("testing.echo")(1) == 1
        return run

    with_spare, _, without_spare = compare_first_faults(start_service, prepare)
    assert without_spare >= 20 and with_spare < without_spare / 3, (with_spare, without_spare)


def test_the_evaluator_warm_up_measures_real_conditions_and_packs_them():
    """What the spare runs before its handoff: the timing loop without a kernel, the device's
    real conditions around it, the packed result (nothing of it reaches a client)."""
    number, results, conditions = evaluator.warm_up(number=7, repeat=3)
    assert number == 7 and len(results) == 3 and all(r > 0 for r in results)
    assert check_conditions(conditions) == conditions
    assert conditions["cpus"] and any(t["tid"] == threading.get_native_id() for t in conditions["threads"])
    profile = profile_codec.decode_profile(profile_codec.encode_profile(number, results, conditions), {}, "warm-up")
    assert profile.results == pytest.approx(results) and profile.conditions["cpus"] == conditions["cpus"]


QUICKENED_BY_THE_WARM_UP = r"""
import os, sys
from kernelrpc.wire import protocol
from kernelrpc.server import handler, session, spare
from kernelrpc.server.config import ServerConfig
from kernelrpc.runtime import evaluator
H = handler.SessionHandler
path = [session.run_session, H.__init__, H._get_global, H._call, H._release, H._free, H._drop, H._empty,
        H._array, H._copy_to, H._copy_from, handler.HandleTable.put, protocol.encode_result,
        protocol.encode_return, protocol.encode_frame, evaluator.warm_up]
spare.warm_up_server(ServerConfig(workspace_root=sys.argv[1]))
assert not os.listdir(sys.argv[1]), os.listdir(sys.argv[1])
print(" ".join(f.__qualname__ for f in path if f.__code__._co_code_adaptive == f.__code__.co_code))
"""


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="CPython 3.11 quickens a code object on its eighth call")
def test_the_servers_warm_up_leaves_the_request_path_quickened(tmp_path):
    """The server serves the scripted session itself often enough, before its first fork, that the
    interpreter has quickened the request path (the tensor requests and the time_evaluator's
    loop too), so every session child inherits it quickened and runs its first requests
    specialized (in a fresh interpreter: nothing else has run that code there); it leaves no
    workspace behind."""
    done = subprocess.run([sys.executable, "-c", QUICKENED_BY_THE_WARM_UP, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "did not go as scripted" not in done.stderr, done.stderr
    assert done.stdout.split() == [], f"not quickened by the warm-up: {done.stdout}"


def test_the_spare_takes_the_page_faults_of_the_first_time_evaluator(start_service, fixture_module):
    """The first time_evaluator call of a spare's session takes far fewer copy-on-write page
    faults than the same in a child forked at connect: the spare ran the timing loop, the
    conditions probe and the packing of a result before its handoff."""
    def prepare(sess):
        module = load_fixture(sess, fixture_module)
        dev = sess.cpu(0)
        a, b = (nd.array(np.zeros(1024, "float32"), dev) for _ in range(2))
        timer = module.time_evaluator("addone", dev, number=100, repeat=20)

        def run():
            assert len(timer(a, b).results) == 20
        return run

    with_spare, warm, without_spare = compare_first_faults(start_service, prepare)
    assert without_spare >= 20 and with_spare < without_spare / 3, (with_spare, without_spare)
    assert not any("warm-up" in line for line in warm.lines)


def test_the_next_spare_is_forked_when_a_session_ends_before_its_child_is_reaped(start_service):
    """A client that connects again as soon as it closed its session needs the next spare warm
    by then: it is forked when the session's child says the session is over, and warms up while
    that child exits and the server cleans up after it (about a millisecond or more)."""
    server = start_server(start_service, "--log-level", "DEBUG")
    early = 0
    for _ in range(5):
        spare = spare_of(server)
        with rpc.connect(server.host, server.port, key="dev") as sess:
            assert sess.info["pid"] == spare
        starts = server.wait_for_line(rf"starts \(child {spare}\)")
        peer = re.search(r"session for (\S+) starts", starts).group(1)
        finished = server.wait_for_line(rf"session from {re.escape(peer)} finished")
        following = spare_of(server, other_than=(spare,))
        server.wait_for_line(rf"spare session child {following} forked")
        after = server.lines[server.lines.index(starts):]
        # forked by the server itself, or asked of its forker (whose answer may come later)
        forked = next(line for line in after if re.search(r"spare session child (asked of the forker|\d+ forked)", line))
        early += server.lines.index(forked) < server.lines.index(finished)
    assert early, "the next spare was forked only after the session's child was reaped, 5 times in a row"


def test_a_spare_warms_up_at_the_lowest_priority_and_only_a_warm_one_takes_a_session(start_service):
    """The warm-up runs in a thread of its own at SCHED_IDLE, the thread that serves the session
    keeps its normal policy; a client that comes while the spare still warms up gets a child
    forked for it (logged), and the spare, once warm, takes the next session."""
    server = start_server(start_service, "--max-sessions", "2")
    spare, held = catch_warming_spare(server)
    try:
        assert os.sched_getscheduler(spare) == os.SCHED_OTHER     # the thread that will serve
        with rpc.connect(server.host, server.port, key="dev") as sess:
            assert sess.info["pid"] != spare
            assert sess.get_function("testing.echo")(3) == 3
        server.wait_for_line(rf"the spare \({spare}\) was still warming up; forked a child for it \(fallback \d+\)")
    finally:
        os.kill(spare, signal.SIGCONT)
    assert spare_of(server, timeout=60) == spare       # at SCHED_IDLE: slow on a busy machine
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["pid"] == spare
        assert sess.get_function("testing.echo")(4) == 4
        assert os.SCHED_IDLE not in policies(spare)
    held.close()


IDLE_WARM_UP = r"""
import os, sys
from kernelrpc.server import spare
from kernelrpc.server.config import ServerConfig
from kernelrpc.server.workspace import Workspace
if sys.argv[2] == "unprivileged":
    spare._normal_policy = lambda: False     # what an unprivileged spare gets: it stays at SCHED_IDLE
spare._warm_up_in_background(ServerConfig(), Workspace.create(sys.argv[1]))
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc are Linux's")
def test_the_idle_warm_up_returns_once_its_thread_has_ended_in_the_kernel(tmp_path):
    """A warm-up thread at SCHED_IDLE whose Python is done still has to exit in the kernel, and the
    joining thread, at the normal priority, takes the CPU from it: on a CPU kept busy it may not
    run again for a long time, and a process is reaped only once all its threads have ended (a
    spare's session child would hold its slot after the session that long). So the thread goes
    back to the normal policy where it may, and the spare goes on only once the thread is gone:
    with its CPU kept busy, nothing of it is left then."""
    cpu = min(os.sched_getaffinity(0))
    pinned = lambda: os.sched_setaffinity(0, {cpu})       # noqa: E731
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pinned)
    try:
        for how in ("unprivileged", "unprivileged", "as this process is"):
            done = subprocess.run([sys.executable, "-c", IDLE_WARM_UP, str(tmp_path), how], preexec_fn=pinned,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and "did not go as scripted" not in done.stderr, done.stderr
            assert done.stdout.split() == ["1"], done.stdout
    finally:
        busy.kill()
        busy.wait()


def test_no_spare_session_forks_at_connect(start_service):
    server = start_server(start_service, "--no-spare-session")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.get_function("testing.echo")(1) == 1
    time.sleep(0.3)
    assert not any(is_spare(c) for c in children(server.proc.pid))
    assert not any("spare" in line for line in server.lines)


def test_a_spare_killed_before_its_session_is_replaced(start_service):
    server = start_server(start_service)
    spare = spare_of(server)
    os.kill(spare, signal.SIGKILL)
    server.wait_for_line(rf"spare session child {spare} died before its session \(signal SIGKILL\); the next spare in")
    replacement = spare_of(server, other_than=(spare,))
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as sess:
        assert sess.info["pid"] == replacement
        assert sess.get_function("testing.echo")("served") == "served"


def test_a_client_that_finds_no_spare_gets_a_fork_and_the_log_says_so(start_service):
    """The spare dies while the server is stopped and a client connects: the server notices
    the death first, has no spare ready, forks one for the client and logs the fallback."""
    server = start_server(start_service)
    spare = spare_of(server)
    result = {}

    def client():
        with rpc.connect(server.host, server.port, key="dev", connect_timeout=20) as sess:
            result["pid"] = sess.info["pid"]
            result["echo"] = sess.get_function("testing.echo")(5)

    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        os.kill(spare, signal.SIGKILL)
        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(0.3)                 # the connection waits in the listen backlog
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    thread.join(30)
    assert result.get("echo") == 5 and result["pid"] != spare
    assert server.wait_for_line(r"session for 127\.0\.0\.1:\d+: no spare was ready; forked a child for it "
                                r"\(fallback 1\)")


def test_the_session_timeout_starts_at_the_handoff(start_service):
    server = start_server(start_service, "--session-timeout", "2")
    spare_of(server)
    time.sleep(2.5)                     # the spare has waited longer than a session may last
    with rpc.connect(server.host, server.port, key="dev") as sess:
        echo = sess.get_function("testing.echo")
        assert echo(1) == 1
        time.sleep(3)
        with pytest.raises(kernelrpc.SessionTimeout, match="2s session has expired"):
            echo(2)


def test_the_clients_timeout_and_crash_notices_arrive_through_a_spare(start_service, fixture_module):
    server = start_server(start_service)
    spare = spare_of(server)
    with rpc.connect(server.host, server.port, key="dev", session_timeout=1) as sess:
        assert sess.info["pid"] == spare and sess.info["session_timeout"] == 1
        module = load_fixture(sess, fixture_module)
        with pytest.raises(kernelrpc.SessionTimeout, match="1s session has expired"):
            module["sleep_ms"](10_000)
    spare = spare_of(server, other_than=(spare,))
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["pid"] == spare
        module = load_fixture(sess, fixture_module)
        with pytest.raises(kernelrpc.ServerCrashed, match="signal 11"):
            module["crash_segv"]()
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.get_function("testing.echo")(3) == 3


def test_a_server_shutdown_reaches_a_spares_session_and_ends_the_spare(start_service):
    server = start_server(start_service, "--max-sessions", "2")
    first = spare_of(server)
    sess = rpc.connect(server.host, server.port, key="dev")
    assert sess.info["pid"] == first
    waiting = spare_of(server, other_than=(first,))        # a free slot: the next spare waits
    server.stop(signal.SIGTERM)
    with pytest.raises(kernelrpc.ConnectionLost, match="shutting down"):
        sess.get_function("testing.echo")(1)
    sess.close()
    wait_until(lambda: gone(first) and gone(waiting), timeout=10, what="the session child and the spare gone")


def test_a_server_killed_takes_its_spare_along(start_service):
    server = start_server(start_service)
    spare = spare_of(server)
    server.stop(signal.SIGKILL)
    wait_until(lambda: gone(spare), timeout=10, what="the spare gone with its server")


def test_a_tls_session_is_handed_to_the_spare(start_service, tls_files):
    server = start_server(start_service, *tls_files.flags())
    spare = spare_of(server)
    with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client()) as sess:
        assert sess.info["pid"] == spare
        assert sess.get_function("testing.echo")("over TLS") == "over TLS"
    with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), session_timeout=1) as sess:
        with pytest.raises(kernelrpc.SessionTimeout):
            sess.get_function("testing.sleep")(10)


def test_a_through_proxy_session_is_handed_to_the_spare(start_service, proxy):
    relay = proxy()
    device = start_service("kernelrpc.server", ["--through-proxy", "--host", relay.host, "--port", str(relay.port),
                                                "--key", "dev"], ready=DEVICE_READY)
    for n in range(2):
        spare = spare_of(device)
        with rpc.connect(relay.host, relay.port, key="dev", connect_timeout=20) as sess:
            assert sess.info["pid"] == spare
            assert sess.get_function("testing.echo")(n) == n
        wait_until(lambda pid=spare: gone(pid), what="the session child gone")
    spare = spare_of(device)
    device.stop(signal.SIGTERM)
    wait_until(lambda: gone(spare), timeout=10, what="the spare gone with its server")


@pytest.mark.parametrize("limits", [{}, {"max_client_tensors": 0}])
def test_the_scripted_session_goes_as_scripted_whatever_the_servers_limits(tmp_path, limits):
    """The warm-up's client speaks through a ClientConnection made from what this server's hello
    would say: a server that takes no pipelined lookup gets none."""
    from kernelrpc.server import spare
    from kernelrpc.server.config import ServerConfig
    from kernelrpc.server.workspace import Workspace

    workspace = Workspace.create(tmp_path)
    try:
        assert spare._serve_script(ServerConfig(**limits), workspace) is None
    finally:
        workspace.remove()


# ---------------------------------------------------------------- the forker
def forker_of(server):
    return wait_until(lambda: next((c for c in children(server.proc.pid) if is_forker(c)), None),
                      timeout=10, what="the server's forker")


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def test_spares_come_from_the_forker_and_the_server_writes_no_shared_page_per_session(start_service):
    """The server forks once (its forker), so a session cycle costs it no copy-on-write faults:
    with a fork per spare it took some 500 per session (docs/performance.md)."""
    server = start_server(start_service)
    forker_of(server)
    spare = spare_of(server)
    assert parent_of(spare) == server.proc.pid                  # adopted: reaped and watched by the server
    for _ in range(3):                                          # past the first writes of each page
        with rpc.connect(server.host, server.port, key="dev") as sess:
            sess.get_function("testing.echo")(1)
        spare = spare_of(server, other_than=(spare,))
    before, sessions = minor_faults(server.proc.pid), 10
    for _ in range(sessions):
        with rpc.connect(server.host, server.port, key="dev") as sess:
            assert sess.info["pid"] == spare
            sess.get_function("testing.echo")(1)
        spare = spare_of(server, other_than=(spare,))
    assert (minor_faults(server.proc.pid) - before) / sessions < 100


def test_a_server_whose_forker_is_gone_forks_its_spares_itself(start_service):
    server = start_server(start_service)
    forker = forker_of(server)
    os.kill(forker, signal.SIGKILL)
    with rpc.connect(server.host, server.port, key="dev") as sess:     # its spare was forked already
        assert sess.get_function("testing.echo")(1) == 1
    server.wait_for_line(rf"the forker \({forker}\) has gone.*; the server forks its spares itself from now on")
    spare = spare_of(server)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["pid"] == spare
        assert sess.get_function("testing.echo")("still") == "still"


def test_a_server_killed_takes_its_forker_along(start_service):
    server = start_server(start_service)
    forker = forker_of(server)
    server.stop(signal.SIGKILL)
    wait_until(lambda: gone(forker), timeout=10, what="the forker gone with its server")
