"""Sessions that misbehave or outlive their server (issue 14), against real server processes."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kernelrpc
from conftest import wait_until
from kernelrpc.server.process_tree import children
from servicectl import gone
from kernelrpc import nd, rpc


def start_server(start_service, *extra):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", *extra])


def test_an_idle_session_ends_and_frees_the_server(start_service):
    server = start_server(start_service, "--idle-timeout", "1", "--io-timeout", "0.5")
    sess = rpc.connect(server.host, server.port, key="dev")
    echo = sess.get_function("testing.echo")
    assert echo(1) == 1
    threading.Event().wait(2.0)                        # idle past the server's --idle-timeout
    with pytest.raises(kernelrpc.SessionTimeout, match="no request for"):
        echo(2)
    sess.close()
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as other:
        assert other.get_function("testing.echo")(3) == 3


def test_a_half_sent_frame_does_not_hold_the_device(start_service):
    server = start_server(start_service, "--io-timeout", "0.5")
    stalled = rpc.connect(server.host, server.port, key="dev")
    stalled._conn.sock.sendall(b"\x40\x00")            # two bytes of a frame header, then nothing
    try:
        with rpc.connect(server.host, server.port, key="dev", connect_timeout=15) as other:
            assert other.get_function("testing.echo")(3) == 3
        assert server.wait_for_line("stalled for 0.5 s")
    finally:
        stalled.close()


def test_a_session_cannot_allocate_more_than_its_total(start_service):
    server = start_server(start_service, "--max-tensor-bytes", str(1 << 20), "--max-session-bytes", str(2 << 20))
    with rpc.connect(server.host, server.port, key="dev") as sess:
        first = nd.empty((1 << 18,), "float32", sess.cpu(0))
        second = nd.empty((1 << 18,), "float32", sess.cpu(0))     # noqa: F841 (kept alive)
        with pytest.raises(kernelrpc.RemoteError, match="per session"):
            nd.empty((1 << 18,), "float32", sess.cpu(0))
        first.free()
        nd.empty((1 << 18,), "float32", sess.cpu(0))


def test_a_killed_server_leaves_no_session_child_and_the_next_cleans_its_workspaces(start_service, tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    server = start_server(start_service, "--workspace-root", str(root))
    sess = rpc.connect(server.host, server.port, key="dev")
    child = sess.info["pid"]
    wait_until(lambda: any(root.iterdir()), what="session workspace")
    os.kill(server.proc.pid, signal.SIGKILL)           # the server only, not its process group
    server.proc.wait(10)
    try:
        wait_until(lambda: gone(child), what="session child gone after kill -9 of its server")
    finally:
        sess.close()
        if not gone(child):
            os.kill(child, signal.SIGKILL)
    assert [p.name.startswith(f"kernelrpc-session-{server.proc.pid}-") for p in root.iterdir()] == [True]
    foreign = root / "someone-else"
    foreign.mkdir()
    start_server(start_service, "--workspace-root", str(root))     # (its spare has a workspace there too)
    stale = f"kernelrpc-session-{server.proc.pid}-"
    wait_until(lambda: not any(p.name.startswith(stale) for p in root.iterdir()), what="stale workspace removed")
    assert foreign.exists()


ONE_THREAD_AT_EXIT = r"""
import os
from kernelrpc.server import process_tree, session
from kernelrpc.server.config import ServerConfig

report_r, report_w = os.pipe()
status_r, status_w = os.pipe()
end_tree = process_tree.end_tree


def threads(where):
    os.write(report_w, f"{where}={len(os.listdir('/proc/self/task'))} ".encode())


def ending_tree(*args):
    threads("ending its tree")
    return end_tree(*args)


process_tree.end_tree = ending_tree
pid = session.fork_child(ServerConfig(), (report_w, status_w), status_w, lambda: threads("serving") or True)
os.close(report_w)
os.close(status_w)
print(b"".join(iter(lambda: os.read(report_r, 1 << 10), b"")).decode())
print("status", os.read(status_r, 16), "exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal and /proc are Linux's")
def test_a_session_child_ends_its_server_watch_before_it_exits():
    """While it serves, a session child has a second thread that waits for the server's death; it
    ends that thread before it ends its tree and exits, and exits with one thread (a thread still
    exiting then would make the server's reap of the child wait for it)."""
    done = subprocess.run([sys.executable, "-c", ONE_THREAD_AT_EXIT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["serving=2 ending its tree=1 ", "status b'e' exit 0"], done.stdout
    assert "server watch" not in done.stderr, done.stderr


def test_a_numpy_argument_beyond_the_frame_limit_is_refused_locally(start_service):
    server = start_server(start_service, "--max-frame-bytes", "65536")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        echo = sess.get_function("testing.echo")
        with pytest.raises(ValueError, match="frame limit of 65536 bytes"):
            echo(np.zeros(100_000, "float32"))
        assert echo(1) == 1                            # the session goes on


FORKING_MODULE = (Path(__file__).parent / "fixtures" / "forking.c").read_text()


def test_processes_a_kernel_starts_end_with_the_session(start_service, tmp_path):
    from fixtures.build import compile_module

    library = compile_module(FORKING_MODULE, tmp_path, "forking")
    server = start_server(start_service)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        sess.upload(library.read_bytes(), "forking.so")
        module = sess.load_module("forking.so")
        out = nd.empty((1,), "int64", sess.cpu(0))
        module["spawn"](out)
        grandchild = int(out.numpy()[0])
        assert grandchild > 0 and not gone(grandchild)
    try:
        wait_until(lambda: gone(grandchild), what="the kernel's process gone with its session")
    finally:
        if not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def session_id(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[3])


def spawn_detached(server, library):
    """A session whose kernel left a daemon behind (its own session, orphaned); returns both."""
    sess = rpc.connect(server.host, server.port, key="dev")
    sess.upload(library.read_bytes(), "forking.so")
    out = nd.empty((1,), "int64", sess.cpu(0))
    sess.load_module("forking.so")["spawn_detached"](out)
    daemon = int(out.numpy()[0])
    assert daemon > 0
    wait_until(lambda: session_id(daemon) == daemon, what="the daemon in a session of its own")
    return sess, daemon


@pytest.mark.parametrize("end", ["session closed", "session child killed with -9", "server killed with -9",
                                 "server killed with -9, session closed at once"])
def test_a_daemon_a_kernel_starts_ends_with_the_session(start_service, tmp_path, end):
    from fixtures.build import compile_module

    library = compile_module(FORKING_MODULE, tmp_path, "forking")
    server = start_server(start_service)
    sess, daemon = spawn_detached(server, library)
    try:
        if end == "session closed":
            sess.close()
        elif end == "session child killed with -9":
            os.kill(sess.info["pid"], signal.SIGKILL)
        else:
            os.kill(server.proc.pid, signal.SIGKILL)   # the server only, not its process group
            if end.endswith("at once"):                # the child ends the session: a race with the
                sess.close()                           # server's parent-death signal
            server.proc.wait(10)
        wait_until(lambda: gone(daemon), what=f"the kernel's daemon gone ({end})")
    finally:
        sess.close()
        if not gone(daemon):
            os.kill(daemon, signal.SIGKILL)
    if not end.startswith("server killed"):            # the server goes on serving
        with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as other:
            assert other.get_function("testing.echo")(1) == 1


OVERRUN_MODULE = r"""
#include <stdint.h>
#define EXPORT __attribute__((visibility("default")))
static const char METADATA[] =
    "{\"format\": \"kernelrpc.module\", \"version\": 1, \"producer\": \"tests\","
    "\"target\": {\"string\": \"c\", \"triple\": \"" KRPC_TRIPLE "\", \"cpu\": \"generic\", \"features\": \"\"},"
    "\"entry\": \"fill\", \"functions\": ["
    "{\"name\": \"fill\", \"symbol\": \"__kernelrpc_fn_fill\", \"args\": ["
    "{\"name\": \"A\", \"kind\": \"tensor\", \"dtype\": \"float32\", \"shape\": [256]}]},"
    "{\"name\": \"fill_past\", \"symbol\": \"__kernelrpc_fn_fill_past\", \"args\": ["
    "{\"name\": \"A\", \"kind\": \"tensor\", \"dtype\": \"float32\", \"shape\": [256]}]}]}";
EXPORT const char *__kernelrpc_metadata(void) { return METADATA; }
EXPORT int32_t __kernelrpc_fn_fill(void **args) {
    float *a = args[0];
    for (int i = 0; i < 256; ++i) a[i] = 1.0f;
    return 0;
}
/* Its code disagrees with its metadata: 64 elements too many. */
EXPORT int32_t __kernelrpc_fn_fill_past(void **args) {
    float *a = args[0];
    for (int i = 0; i < 256 + 64; ++i) a[i] = 2.0f;
    return 0;
}
EXPORT int64_t __kernelrpc_time(int32_t (*fn)(void **), void **args, int64_t number) {
    for (int64_t i = 0; i < number; ++i) fn(args);
    return 0;
}
"""


def test_checked_mode_names_the_call_that_wrote_past_a_tensor(start_service, tmp_path):
    from fixtures.build import compile_module

    library = compile_module(OVERRUN_MODULE, tmp_path, "overrun")
    server = start_server(start_service, "--checked-tensors")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        sess.upload(library.read_bytes(), "overrun.so")
        module = sess.load_module("overrun.so")
        a = nd.empty((256,), "float32", sess.cpu(0))
        module["fill"](a)
        assert (a.numpy() == 1.0).all()
        with pytest.raises(kernelrpc.RemoteError, match="256 of the 4096 bytes after its end") as info:
            module["fill_past"](a)
        assert info.value.type_name == "TensorOverrun"
        module["fill"](a)                              # the pads were restored: checked again, and fine
        assert sess.get_function("testing.echo")(5) == 5


def test_a_trickling_upload_does_not_hold_the_device(start_service):
    from kernelrpc.wire import protocol as P

    server = start_server(start_service, "--io-timeout", "1", "--min-transfer-rate", str(1 << 20))
    slow = rpc.connect(server.host, server.port, key="dev")
    slow._conn.send(P.encode_request(P.UPLOAD, ["big.bin", 256 << 10]))
    stop = threading.Event()

    def trickle():                                     # 16 KiB/s: a 256 KiB upload would take 16 s
        try:
            while not stop.wait(0.05):
                slow._conn.sock.sendall(b"x" * 800)
        except OSError:
            pass

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        with rpc.connect(server.host, server.port, key="dev", connect_timeout=15) as other:
            assert other.get_function("testing.echo")(3) == 3
        assert server.wait_for_line("slower than the server's minimum")
    finally:
        stop.set()
        sender.join(10)
        slow.close()


def test_a_session_child_killed_before_the_hello_is_reported_as_a_crash(start_service):
    """The parent's crash notice arrives where the client waits for the hello reply."""
    import socket

    from kernelrpc.netutil import receive_until
    from kernelrpc.server.forker import is_forker
    from kernelrpc.wire import handshake as H
    from kernelrpc.wire.hello import HelloReplyParser, encode_hello

    server = start_server(start_service)
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(H.encode_preamble(H.make_key("client", "dev")))
        receive_until(sock, H.ReplyParser(), "server", "the handshake").raise_for_code()
        (child,) = wait_until(lambda: [c for c in children(server.proc.pid) if not is_forker(c)],
                              what="the session child")
        os.kill(child, signal.SIGKILL)
        wait_until(lambda: child not in children(server.proc.pid), what="the session child reaped")
        try:
            sock.sendall(encode_hello())
        except OSError:
            pass                                       # the notice was sent before the hello
        with pytest.raises(kernelrpc.ServerCrashed, match="signal 9") as info:
            receive_until(sock, HelloReplyParser(), "server", "the version exchange")
        assert info.value.signal == signal.SIGKILL
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as sess:
        assert sess.get_function("testing.echo")(1) == 1


@pytest.mark.parametrize("kind, error", [("ServerCrashed", kernelrpc.ServerCrashed),
                                         ("SessionTimeout", kernelrpc.SessionTimeout),
                                         ("ServerShutdown", kernelrpc.ConnectionLost)])
def test_the_hello_reply_parser_turns_a_notice_into_its_error_byte_by_byte(kind, error):
    from kernelrpc.wire import protocol as P
    from kernelrpc.wire.hello import HelloReplyParser

    notice = P.encode_notice(kind, "gone", signal=9 if kind == "ServerCrashed" else None)
    parser = HelloReplyParser()
    for i in range(len(notice) - 1):
        assert parser.feed(notice[i:i + 1]) is None
    with pytest.raises(error, match="gone"):
        parser.feed(notice[-1:])
