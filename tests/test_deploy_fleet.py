"""kernelrpc.deploy.fleet: a tracker that listens is used as it is; with none, a local tracker and
device servers are started for the session, said in one line, and stopped when it closes."""
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kernelrpc.deploy.fleet import FleetTrackerSession, LocalFleet, connect_or_start
from kernelrpc.errors import ProtocolError
from kernelrpc.rpc.tracker_client import TrackerNotListening, TrackerUnreachable
from servicectl import SRC, start_server, start_tracker

ROOT = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_listening_tracker_is_used_and_nothing_is_started(start_service):
    tracker = start_tracker(start_service)
    start_server(start_service, tracker, key="lab").wait_for_line("registered")
    said = []
    with connect_or_start(tracker.host, tracker.port, "lab", say=said.append) as session:
        assert not isinstance(session, FleetTrackerSession) and said == []
        assert session.addr == (tracker.host, tracker.port)
        with session.request("lab", session_timeout=30) as remote:
            assert remote.get_function("testing.echo")(7) == 7


def test_with_no_tracker_a_local_fleet_serves_the_session_and_stops_with_it():
    port = _closed_port()
    said = []
    session = connect_or_start("127.0.0.1", port, "fresh", devices=2, say=said.append)
    try:
        (line,) = said
        match = re.match(rf"cannot reach tracker at 127\.0\.0\.1:{port}: .*: started a local tracker "
                         r"at 127\.0\.0\.1:(\d+) and 2 device servers with key 'fresh' "
                         r"\(127\.0\.0\.1:(\d+), 127\.0\.0\.1:(\d+)\)", line)
        assert match, line
        ports = [int(p) for p in match.groups()]
        assert session.addr == ("127.0.0.1", ports[0])
        assert session.summary()["queue_info"]["fresh"]["free"] == 2   # both registered already
        with session.request("fresh", session_timeout=30) as remote:
            assert remote.get_function("testing.echo")(7) == 7
    finally:
        session.close()
    assert all(_refused(p) for p in ports)


def test_a_peer_that_is_no_tracker_is_an_error_and_starts_nothing():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4)
            conn.sendall(b"HTTP/1.1 400\r\n\r\n")
    thread = threading.Thread(target=answer)
    thread.start()
    said = []
    try:
        with pytest.raises((TrackerUnreachable, ProtocolError)) as info:
            connect_or_start("127.0.0.1", listener.getsockname()[1], "x", say=said.append)
        assert not isinstance(info.value, TrackerNotListening) and said == []
    finally:
        thread.join(10)
        listener.close()


def test_a_fleet_that_cannot_start_stops_what_it_started():
    with pytest.raises(ValueError, match="at least one"):
        LocalFleet("k", devices=0)
    with pytest.raises(RuntimeError, match="did not become ready"):
        LocalFleet("k", server_args=lambda index: ["--no-such-flag"])


def test_tune_gemm_example_runs_without_a_tracker(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC)
    env.pop("KERNELRPC_TRACKER", None)
    port = _closed_port()
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tune_gemm.py"), "--size", "32",
                          "--trials", "2", "--tracker", f"127.0.0.1:{port}", "--log",
                          str(tmp_path / "tune.log")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"cannot reach tracker at 127\.0\.0\.1:{port}: .*started a local tracker", out.stdout)
    assert "GFLOP/s tuned" in out.stdout and (tmp_path / "tune.log").stat().st_size > 0
