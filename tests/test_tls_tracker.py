"""TLS at the tracker and on every link to it: servers registering, clients requesting, the query tool."""
import json
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import wait_until
from kernelrpc.wire import tls as T
from kernelrpc.rpc.tracker_client import connect_tracker
from kernelrpc.wire.tracker_codec import MAGIC_BYTES
from servicectl import child_env

TOKEN = "lab-token-0123456789abcdef"


def tls_queue(tracker, tls, key="board"):
    with connect_tracker(*tracker.address, tls=tls) as session:
        return session.summary()["queue_info"].get(key, {"free": 0, "pending": 0})


@pytest.fixture
def tls_tracker(start_service, tls_files):
    return start_service("kernelrpc.tracker", ["--port", "0", *tls_files.flags()])


def start_tls_server(start_service, tracker, tls_files, *extra, key="board"):
    return start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}", "--key", key,
                                              *tls_files.flags(), *extra])


def test_tracker_server_and_client_all_over_tls(start_service, tls_tracker, tls_files, fixture_module):
    assert tls_tracker.match.string.rstrip().endswith("(TLS)")
    start_tls_server(start_service, tls_tracker, tls_files)
    wait_until(lambda: tls_queue(tls_tracker, tls_files.client())["free"] == 1, what="the server registered")
    with connect_tracker(*tls_tracker.address, tls=tls_files.client()) as tracker:
        info = tracker.summary()
        assert info["server_info"][0]["device"]["machine"]     # the device info reached the tracker
        with tracker.request("board", timeout=20) as sess:
            sess.upload(fixture_module, "kernels.so")
            module = sess.load_module("kernels.so")
            a = sess.array(np.arange(1024, dtype="float32"))
            b = sess.empty((1024,), "float32")
            module["addone"](a, b)
            np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)


def test_mutual_tls_everywhere(start_service, tls_files):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", *tls_files.flags(client_cert=True)])
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                                "--key", "board", "--tls-ca", tls_files.ca,
                                                "--tls-cert", tls_files.cert, "--tls-require-client-cert"])
    client = tls_files.client(with_cert=True)
    wait_until(lambda: tls_queue(tracker, client)["free"] == 1, what="the server registered with its certificate")
    with connect_tracker(*tracker.address, tls=client) as session:
        with session.request("board", timeout=20) as sess:
            assert sess.get_function("testing.echo")("mutual") == "mutual"
    with pytest.raises(T.TLSError, match="requires a client certificate"):
        connect_tracker(*tracker.address, tls=tls_files.client())
    tracker.wait_for_line("the TLS handshake failed", timeout=10)
    assert server.port


def test_environment_turns_tls_on_for_tracker_and_servers(start_service, tls_tracker, tls_files, monkeypatch):
    start_tls_server(start_service, tls_tracker, tls_files)
    monkeypatch.setenv(T.ENV_CA, tls_files.ca)
    wait_until(lambda: tls_queue(tls_tracker, None)["free"] == 1, what="the server registered")
    with connect_tracker(*tls_tracker.address) as tracker, tracker.request("board", timeout=20) as sess:
        assert sess.get_function("testing.echo")(5) == 5


def test_plain_client_to_tls_tracker_gets_a_typed_error_at_once(tls_tracker, monkeypatch):
    monkeypatch.delenv(T.ENV_CA, raising=False)
    started = time.monotonic()
    with pytest.raises(T.TLSError, match="requires TLS"):
        connect_tracker(*tls_tracker.address)
    assert time.monotonic() - started < 5
    tls_tracker.wait_for_line("spoke plain TCP to this TLS tracker", timeout=10)


def test_tls_client_to_plain_tracker_gets_a_typed_error_at_once(tracker, tls_files):
    started = time.monotonic()
    with pytest.raises(T.TLSError, match="does not speak TLS"):
        connect_tracker(*tracker.address, tls=tls_files.client())
    assert time.monotonic() - started < 5
    tracker.wait_for_line("speaks TLS, and this tracker runs without TLS", timeout=10)


def test_untrusted_tracker_certificate(start_service, tls_files):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--tls-cert", tls_files.untrusted_cert])
    with pytest.raises(T.TLSError, match="certificate failed verification"):
        connect_tracker(*tracker.address, tls=tls_files.client())


def test_plain_server_cannot_register_at_a_tls_tracker(start_service, tls_tracker, tls_files):
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tls_tracker.port}",
                                                "--key", "board"])
    tls_tracker.wait_for_line("spoke plain TCP to this TLS tracker", timeout=20)
    server.wait_for_line("requires TLS .*start this server with --tls-ca", timeout=20)
    assert tls_queue(tls_tracker, tls_files.client())["free"] == 0


def test_tls_and_auth_together_at_the_tracker(start_service, tls_files, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags = ["--auth-token-file", str(token_file), *tls_files.flags()]
    tracker = start_service("kernelrpc.tracker", ["--port", "0", *flags])
    start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}", "--key", "board",
                                       *flags])
    client = tls_files.client()

    def free():
        with connect_tracker(*tracker.address, tls=client, auth_token=TOKEN) as session:
            return session.summary()["queue_info"].get("board", {}).get("free", 0)

    wait_until(free, what="the server registered")
    with connect_tracker(*tracker.address, tls=client, auth_token=TOKEN) as session:
        with session.request("board", timeout=20) as sess:
            assert sess.get_function("testing.echo")("both") == "both"


def query(tracker, *flags, env=None):
    return subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--host", "127.0.0.1",
                           "--port", str(tracker.port), *flags], capture_output=True, text=True, timeout=60,
                          env=child_env(env))


def test_query_tool_over_tls(start_service, tls_tracker, tls_files):
    start_tls_server(start_service, tls_tracker, tls_files)
    wait_until(lambda: tls_queue(tls_tracker, tls_files.client())["free"] == 1, what="the server registered")
    out = query(tls_tracker, "--json", "--tls-ca", tls_files.ca)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["summary"]["queue_info"]["board"]["free"] == 1
    out = query(tls_tracker, env={T.ENV_CA: tls_files.ca})
    assert out.returncode == 0 and "board" in out.stdout, out.stderr
    out = query(tls_tracker)
    assert out.returncode == 1 and "requires TLS" in out.stderr and "--tls-ca" in out.stderr


def test_stalled_tls_openings_do_not_block_others_and_are_bounded(start_service, tls_files):
    """Peers that connect and never finish the TLS handshake neither block other clients nor
    hold their host's connections: at the per-host cap the oldest unfinished one goes."""
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--max-connections-per-host", "4",
                                                  *tls_files.flags()])
    stalled = []
    try:
        for i in range(8):
            sock = socket.create_connection(tracker.address, timeout=10)
            if i % 2:
                sock.sendall(bytes([T.TLS_HANDSHAKE_RECORD, 3, 1]))
            stalled.append(sock)
        time.sleep(0.2)
        with connect_tracker(*tracker.address, tls=tls_files.client(), connect_timeout=10) as session:
            session.ping()
        for sock in stalled[:5]:      # the oldest ones made room for the later ones and the client
            sock.settimeout(1)
            assert _closed_by_peer(sock)
        for sock in stalled[5:]:      # the others go at the 10 s opening limit
            sock.settimeout(15)
            assert _closed_by_peer(sock)
    finally:
        for sock in stalled:
            sock.close()


def _closed_by_peer(sock) -> bool:
    try:
        return sock.recv(16) == b""
    except ConnectionResetError:      # closed with the peer's unread bytes in its buffer
        return True


def test_raw_plaintext_peer_reads_the_refusal_code(tls_tracker):
    with socket.create_connection(tls_tracker.address, timeout=10) as sock:
        sock.sendall(MAGIC_BYTES)
        assert sock.recv(16) == T.PLAINTEXT_REFUSAL


def test_a_plain_tracker_query_does_not_load_openssl(tracker):
    """TLS costs start-up only where it is used: ``ssl`` is some 15 ms of imports."""
    script = (f"import sys\nfrom kernelrpc import rpc\nwith rpc.connect_tracker('127.0.0.1', {tracker.port}) as t:\n"
              "    t.ping()\nprint('ssl' in sys.modules, '_ssl' in sys.modules)")
    env = {k: v for k, v in child_env().items() if not k.startswith("KERNELRPC_TLS_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_status_page_of_a_tls_tracker_is_https(start_service, tls_files):
    import ssl
    import urllib.request

    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0", *tls_files.flags()])
    page = tracker.wait_for_line(r"status page on https://").split("status page on ", 1)[1].strip()
    ctx = ssl.create_default_context(cafile=tls_files.ca)
    with urllib.request.urlopen(page + "api/status", timeout=10, context=ctx) as response:
        assert "queues" in json.loads(response.read())
