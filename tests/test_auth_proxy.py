"""Shared-secret authentication at the proxy: devices, clients and the proxy's tracker link."""
import re
import socket

import pytest

from kernelrpc import AuthenticationError, rpc
from kernelrpc.wire import auth as A
from kernelrpc.wire import handshake as H

from servicectl import AUTH_TOKEN as TOKEN
DEVICE_READY = re.compile(r"connected to proxy (\S+):(\d+)")



@pytest.fixture
def proxy(start_service, token_file):
    return start_service("kernelrpc.proxy", ["--port", "0", "--auth-token-file", token_file])


def start_device(start_service, proxy, token_file, key="dev", ready=DEVICE_READY):
    return start_service("kernelrpc.server", ["--through-proxy", "--host", proxy.host, "--port",
                                              str(proxy.port), "--key", key, "--auth-token-file", token_file],
                         ready=ready)


def test_authenticated_device_and_client_pair_end_to_end(start_service, proxy, token_file):
    start_device(start_service, proxy, token_file)
    with rpc.connect(proxy.host, proxy.port, key="dev", auth_token=TOKEN, connect_timeout=20) as sess:
        assert sess.get_function("testing.echo")("via the proxy") == "via the proxy"


def test_client_without_or_with_a_wrong_token_is_refused(start_service, proxy, token_file, monkeypatch):
    monkeypatch.delenv(A.ENV_TOKEN, raising=False)
    start_device(start_service, proxy, token_file)
    with pytest.raises(AuthenticationError, match="requires authentication"):
        rpc.connect(proxy.host, proxy.port, key="dev", connect_timeout=10)
    with pytest.raises(AuthenticationError, match="refused our auth token"):
        rpc.connect(proxy.host, proxy.port, key="dev", auth_token="wrong-token-here", connect_timeout=10)


def test_fake_device_registration_is_refused(proxy):
    """The attack the proxy had no answer to: a ``server:KEY`` that waits for the next client."""
    key = H.make_key("server", "dev")
    with socket.create_connection(proxy.address, timeout=10) as sock:
        sock.sendall(H.encode_preamble(key))
        head = sock.recv(4)
        assert head == A.CHALLENGE_HEAD        # instead of waiting for a client
        sock.recv(A.NONCE_BYTES)
        forged = A.PeerAuth(b"a guessed token", key.encode()).feed(head + b"\0" * A.NONCE_BYTES)
        sock.sendall(forged)
        assert A._I32.unpack(sock.recv(4))[0] == A.AUTH_REFUSED
        assert sock.recv(16) == b""            # and the proxy closed the connection
    proxy.wait_for_line("does not know the auth token", timeout=10)


def test_device_with_a_wrong_token_is_refused(start_service, proxy, tmp_path):
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-lab-token")
    device = start_device(start_service, proxy, str(wrong), ready=re.compile("refused our auth token"))
    assert not any("connected to proxy" in line for line in device.lines)


def test_tracker_proxy_device_client_all_authenticated(start_service, token_file):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--auth-token-file", token_file])
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--auth-token-file", token_file,
                                              "--tracker", f"{tracker.host}:{tracker.port}"])
    start_device(start_service, proxy, token_file, key="proxied")
    with rpc.connect_tracker(tracker.host, tracker.port, auth_token=TOKEN) as trk:
        with trk.request("proxied", timeout=30) as sess:
            assert sess.get_function("testing.echo")(42) == 42
