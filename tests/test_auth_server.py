"""Shared-secret authentication at the device server, with real server processes."""
import socket
import subprocess
import sys

import pytest

from kernelrpc import AuthenticationError, rpc
from kernelrpc.wire import auth as A
from kernelrpc.wire import handshake as H
from servicectl import AUTH_TOKEN as TOKEN, child_env




@pytest.fixture
def auth_server(start_service, token_file):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--auth-token-file", token_file])


def test_client_without_token_is_refused_with_a_clear_error(auth_server, monkeypatch):
    monkeypatch.delenv(A.ENV_TOKEN, raising=False)
    with pytest.raises(AuthenticationError, match="requires authentication.*auth_token"):
        rpc.connect(auth_server.host, auth_server.port, key="dev", connect_timeout=10)


def test_wrong_token_is_refused(auth_server):
    with pytest.raises(AuthenticationError, match="refused our auth token"):
        rpc.connect(auth_server.host, auth_server.port, key="dev", auth_token="not-the-lab-token",
                    connect_timeout=10)
    auth_server.wait_for_line("does not know the auth token", timeout=10)


def test_right_token_runs_a_session_end_to_end(auth_server, fixture_module):
    with rpc.connect(auth_server.host, auth_server.port, key="dev", auth_token=TOKEN,
                     connect_timeout=10) as sess:
        assert sess.get_function("testing.echo")("authenticated") == "authenticated"
        sess.upload(fixture_module, "kernels.so")
        assert sess.load_module("kernels.so") is not None


def test_token_from_the_environment(auth_server, monkeypatch):
    monkeypatch.setenv(A.ENV_TOKEN, TOKEN)
    with rpc.connect(auth_server.host, auth_server.port, key="dev", connect_timeout=10) as sess:
        assert sess.get_function("testing.echo")(1) == 1


def raw_exchange(server, answer_for):
    """Send the handshake key, read the challenge, send ``answer_for(challenge)``; return the
    server's verdict and whatever follows it until the server stops sending."""
    key = H.make_key("client", "dev")
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(H.encode_preamble(key))
        challenge = recv_exactly(sock, 4 + A.NONCE_BYTES)
        sock.sendall(answer_for(key, challenge))
        verdict = recv_exactly(sock, 4)
        return A._I32.unpack(verdict)[0], sock.recv(4096)


def recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"server closed after {data!r}"
        data += chunk
    return data


def test_replayed_exchange_is_refused(auth_server):
    captured = []

    def honest(key, challenge):
        answer = A.PeerAuth(TOKEN.encode(), key.encode()).feed(challenge)
        captured.append(answer)
        return answer

    code, _ = raw_exchange(auth_server, honest)
    assert code == A.AUTH_OK
    code, rest = raw_exchange(auth_server, lambda key, challenge: captured[0])
    assert code == A.AUTH_REFUSED and rest == b""  # and the server closed the connection


def test_token_given_to_a_server_without_auth_is_not_sent_unauthenticated(start_service):
    plain = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])
    with pytest.raises(AuthenticationError, match="does not ask for authentication"):
        rpc.connect(plain.host, plain.port, key="dev", auth_token=TOKEN, connect_timeout=10)


def run_server_cli(*args, timeout=20):
    return subprocess.run([sys.executable, "-m", "kernelrpc.server", "--port", "0", *args],
                          capture_output=True, text=True, env=child_env(), timeout=timeout)


def test_non_loopback_without_auth_warns_what_is_exposed(start_service, monkeypatch):
    server = start_service("kernelrpc.server", ["--host", "0.0.0.0", "--port", "0", "--key", "dev"])
    warning = next(line for line in server.lines if "without authentication" in line)
    assert "can run any code" in warning and "--auth-token-file" in warning


def test_loopback_without_auth_does_not_warn(start_service):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])
    assert not any("without authentication" in line for line in server.lines)


def test_require_auth_without_a_token_refuses_to_start():
    done = run_server_cli("--require-auth")
    assert done.returncode != 0 and "--require-auth but no auth token" in done.stderr


def test_unreadable_or_short_token_file_is_a_start_up_error(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc")
    done = run_server_cli("--auth-token-file", str(short))
    assert done.returncode != 0 and "auth token must be" in done.stderr
    done = run_server_cli("--auth-token-file", str(tmp_path / "missing"))
    assert done.returncode != 0 and "No such file" in done.stderr
