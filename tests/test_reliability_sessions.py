"""Sessions that misbehave or outlive their server (issue 14), against real server processes."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc


def start_server(start_service, *extra):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", *extra])


def until(predicate, timeout=20.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        threading.Event().wait(0.02)
    raise TimeoutError(f"{what} not reached within {timeout} s")


def gone(pid):
    """The process has exited (and is not a zombie of ours)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


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
    until(lambda: any(root.iterdir()), what="session workspace")
    os.kill(server.proc.pid, signal.SIGKILL)           # the server only, not its process group
    server.proc.wait(10)
    try:
        until(lambda: gone(child), what="session child gone after kill -9 of its server")
    finally:
        sess.close()
        if not gone(child):
            os.kill(child, signal.SIGKILL)
    assert [p.name.startswith(f"kernelrpc-session-{server.proc.pid}-") for p in root.iterdir()] == [True]
    foreign = root / "someone-else"
    foreign.mkdir()
    start_server(start_service, "--workspace-root", str(root))
    until(lambda: [p.name for p in root.iterdir()] == ["someone-else"], what="stale workspace removed")


def test_a_numpy_argument_beyond_the_frame_limit_is_refused_locally(start_service):
    server = start_server(start_service, "--max-frame-bytes", "65536")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        echo = sess.get_function("testing.echo")
        with pytest.raises(ValueError, match="frame limit of 65536 bytes"):
            echo(np.zeros(100_000, "float32"))
        assert echo(1) == 1                            # the session goes on
