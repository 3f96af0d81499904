"""Shared-secret authentication at the tracker, with real tracker, server and query processes."""
import socket
import subprocess
import sys

import pytest

from kernelrpc import AuthenticationError, rpc
from kernelrpc.wire import auth as A
from kernelrpc.wire.tracker_codec import MAGIC_BYTES
from servicectl import AUTH_TOKEN as TOKEN
from servicectl import child_env




@pytest.fixture
def tracker(start_service, token_file):
    return start_service("kernelrpc.tracker", ["--port", "0", "--auth-token-file", token_file])


def test_unauthenticated_client_is_refused(tracker, monkeypatch):
    monkeypatch.delenv(A.ENV_TOKEN, raising=False)
    with pytest.raises(AuthenticationError, match="requires authentication"):
        rpc.connect_tracker(tracker.host, tracker.port)


@pytest.mark.parametrize("variable", [A.ENV_TOKEN, A.ENV_TOKEN_FILE])
def test_the_token_can_come_from_the_environment(tracker, token_file, monkeypatch, variable):
    monkeypatch.delenv(A.ENV_TOKEN, raising=False)
    monkeypatch.setenv(variable, TOKEN if variable == A.ENV_TOKEN else token_file)
    with rpc.connect_tracker(tracker.host, tracker.port) as t:
        assert "queue_info" in t.summary()


def test_wrong_token_is_refused(tracker):
    with pytest.raises(AuthenticationError, match="refused our auth token"):
        rpc.connect_tracker(tracker.host, tracker.port, auth_token="some-other-token")
    tracker.wait_for_line("does not know the auth token", timeout=10)


def test_right_token_tracker_request_session_call(tracker, start_service, token_file):
    start_service("kernelrpc.server", ["--port", "0", "--key", "authdev", "--auth-token-file", token_file,
                                       "--tracker", f"{tracker.host}:{tracker.port}"])
    with rpc.connect_tracker(tracker.host, tracker.port, auth_token=TOKEN) as trk:
        with trk.request("authdev", timeout=30) as sess:
            assert sess.get_function("testing.echo")("through the tracker") == "through the tracker"


def test_server_with_a_wrong_token_never_registers(tracker, start_service, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-lab-token")
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "intruder", "--auth-token-file",
                                                str(wrong), "--tracker", f"{tracker.host}:{tracker.port}"])
    server.wait_for_line("refused our auth token", timeout=15)
    with rpc.connect_tracker(tracker.host, tracker.port, auth_token=TOKEN) as trk:
        assert "intruder" not in trk.summary()["queue_info"]


def test_replayed_tracker_exchange_is_refused(tracker):
    def exchange(answer_for):
        with socket.create_connection(tracker.address, timeout=10) as sock:
            sock.sendall(MAGIC_BYTES)
            challenge = b""
            while len(challenge) < 4 + A.NONCE_BYTES:
                challenge += sock.recv(64)
            sock.sendall(answer_for(challenge))
            return A._I32.unpack(sock.recv(4))[0]

    captured = []
    def honest(challenge):
        captured.append(A.PeerAuth(TOKEN.encode(), A.AUTH_CONTEXT).feed(challenge))
        return captured[0]

    assert exchange(honest) == A.AUTH_OK
    assert exchange(lambda challenge: captured[0]) == A.AUTH_REFUSED


def query(tracker, *args, env=None):
    return subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--host", tracker.host,
                           "--port", str(tracker.port), *args], capture_output=True, text=True,
                          env=child_env(env), timeout=30)


def test_query_tool_authenticates(tracker, token_file):
    refused = query(tracker)
    assert refused.returncode == 1 and "requires authentication" in refused.stderr
    done = query(tracker, "--auth-token-file", token_file)
    assert "Tracker address" in done.stdout, done.stderr
    done = query(tracker, env={A.ENV_TOKEN: TOKEN})
    assert "Tracker address" in done.stdout, done.stderr


def test_tracker_on_every_interface_without_auth_warns(start_service):
    tracker = start_service("kernelrpc.tracker", ["--host", "0.0.0.0", "--port", "0"])
    warning = next(line for line in tracker.lines if "without authentication" in line)
    assert "register fake servers" in warning
