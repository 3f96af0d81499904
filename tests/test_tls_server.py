"""TLS at the device server, with real server processes: sessions, crashes, timeouts and refusals."""
import signal
import socket
import time

import numpy as np
import pytest

import kernelrpc
from conftest import wait_until
from servicectl import gone
from kernelrpc import rpc
from kernelrpc.wire import handshake as H
from kernelrpc.wire import tls as T

TOKEN = "lab-token-0123456789abcdef"


@pytest.fixture
def tls_server(start_service, tls_files):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", *tls_files.flags()])


@pytest.fixture
def mtls_server(start_service, tls_files):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--handshake-timeout", "2",
                                              *tls_files.flags(client_cert=True)])


def load_fixture(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


def test_session_over_tls_runs_a_kernel(tls_server, tls_files, fixture_module):
    assert tls_server.match.string.rstrip().endswith("(TLS)")
    with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client()) as sess:
        assert sess.get_function("testing.echo")("over TLS") == "over TLS"
        module = load_fixture(sess, fixture_module)
        a = sess.array(np.arange(1024, dtype="float32"))
        b = sess.empty((1024,), "float32")
        module["addone"](a, b)
        np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
        big = np.random.default_rng(0).standard_normal(1 << 20).astype("float32")
        assert np.array_equal(sess.array(big).numpy(), big)


def test_tls_from_the_environment(tls_server, tls_files, monkeypatch):
    monkeypatch.setenv(T.ENV_CA, tls_files.ca)
    with rpc.connect(tls_server.host, tls_server.port, key="dev") as sess:
        assert sess.get_function("testing.echo")(7) == 7


def test_ready_ssl_context_is_accepted(tls_server, tls_files):
    ctx = tls_files.client().client_context()
    with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=ctx) as sess:
        assert sess.get_function("testing.echo")(8) == 8


def test_plain_client_to_tls_server_gets_a_typed_error_at_once(tls_server, monkeypatch):
    monkeypatch.delenv(T.ENV_CA, raising=False)
    started = time.monotonic()
    with pytest.raises(T.TLSError, match="requires TLS.*tls=TLSConfig"):
        rpc.connect(tls_server.host, tls_server.port, key="dev", connect_timeout=10)
    assert time.monotonic() - started < 5
    tls_server.wait_for_line("spoke plain TCP to this TLS server", timeout=10)


def test_tls_client_to_plain_server_gets_a_typed_error_at_once(server, tls_files):
    started = time.monotonic()
    with pytest.raises(T.TLSError, match="does not speak TLS"):
        rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), connect_timeout=10)
    assert time.monotonic() - started < 5
    server.wait_for_line("speaks TLS, and this server runs without TLS", timeout=10)


def test_untrusted_certificate_names_the_verification_failure(start_service, tls_files):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--tls-cert",
                                                tls_files.untrusted_cert])
    with pytest.raises(T.TLSError, match="certificate failed verification.*self-signed|certificate failed "
                                         "verification.*unable to get local issuer"):
        rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), connect_timeout=10)


def test_certificate_for_another_host_is_refused(start_service, tls_files):
    """Trusted CA, but the certificate does not name the host the client connects to."""
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--tls-cert", tls_files.client_cert])
    with pytest.raises(T.TLSError, match="certificate failed verification.*mismatch"):
        rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), connect_timeout=10)


def test_mutual_tls_accepts_a_client_certificate(mtls_server, tls_files):
    with rpc.connect(mtls_server.host, mtls_server.port, key="dev", tls=tls_files.client(with_cert=True)) as sess:
        assert sess.get_function("testing.echo")("mutual") == "mutual"


def test_mutual_tls_without_a_client_certificate_is_refused_and_others_go_on(mtls_server, tls_files):
    with pytest.raises(T.TLSError, match="requires a client certificate"):
        rpc.connect(mtls_server.host, mtls_server.port, key="dev", tls=tls_files.client(), connect_timeout=10)
    mtls_server.wait_for_line("the TLS handshake failed", timeout=10)
    untrusted = T.TLSConfig(cafile=tls_files.ca, certfile=tls_files.untrusted_cert)
    with pytest.raises(T.TLSError, match="refused our client certificate"):
        rpc.connect(mtls_server.host, mtls_server.port, key="dev", tls=untrusted, connect_timeout=10)
    with rpc.connect(mtls_server.host, mtls_server.port, key="dev", tls=tls_files.client(with_cert=True)) as sess:
        assert sess.get_function("testing.echo")("next") == "next"


@pytest.mark.parametrize("function, sig, code", [("crash_segv", signal.SIGSEGV, None), ("exit_now", None, 3)])
def test_kernel_crash_over_tls_reaches_the_client_typed(tls_server, tls_files, fixture_module, function, sig,
                                                         code):
    with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client()) as sess:
        module = load_fixture(sess, fixture_module)
        with pytest.raises(kernelrpc.ServerCrashed) as info:
            module[function]()
        assert info.value.signal == sig and info.value.exit_code == code
    with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client()) as sess:
        assert sess.get_function("testing.echo")("still serving") == "still serving"


def test_session_timeout_over_tls(tls_server, tls_files, fixture_module):
    with rpc.connect(tls_server.host, tls_server.port, key="dev", session_timeout=1, tls=tls_files.client()) as sess:
        module = load_fixture(sess, fixture_module)
        started = time.monotonic()
        with pytest.raises(kernelrpc.SessionTimeout, match="1s session has expired"):
            module["sleep_ms"](60_000)
        assert time.monotonic() - started < 60
    with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client()) as sess:
        assert sess.get_function("testing.echo")(1) == 1


def test_tls_and_auth_together(start_service, tls_files, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--auth-token-file",
                                                str(token_file), *tls_files.flags()])
    with pytest.raises(kernelrpc.AuthenticationError, match="refused our auth token"):
        rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), auth_token="another-token-123",
                    connect_timeout=10)
    with pytest.raises(T.TLSError, match="requires TLS"):
        rpc.connect(server.host, server.port, key="dev", auth_token=TOKEN, connect_timeout=10)
    with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client(), auth_token=TOKEN) as sess:
        assert sess.get_function("testing.echo")("both") == "both"


def test_stalled_tls_handshakes_do_not_block_others_and_are_dropped(mtls_server, tls_files):
    """Peers that open a TLS hello and stop, or never send a byte, hold no slot for long."""
    stalled = []
    for i in range(6):
        sock = socket.create_connection(mtls_server.address, timeout=10)
        if i % 2:
            sock.sendall(bytes([T.TLS_HANDSHAKE_RECORD, 3, 1]))   # a hello that never goes on
        stalled.append(sock)
    try:
        with rpc.connect(mtls_server.host, mtls_server.port, key="dev", tls=tls_files.client(with_cert=True),
                         connect_timeout=10) as sess:
            assert sess.get_function("testing.echo")("not blocked") == "not blocked"
        for sock in stalled:                  # --handshake-timeout 2: each is closed by the server
            sock.settimeout(10)
            assert sock.recv(16) == b""
    finally:
        for sock in stalled:
            sock.close()


def test_raw_plaintext_peer_reads_the_refusal_code(tls_server):
    with socket.create_connection(tls_server.address, timeout=10) as sock:
        sock.sendall(H.encode_preamble(H.make_key("client", "dev")))
        assert sock.recv(16) == T.PLAINTEXT_REFUSAL


def test_server_shutdown_mid_tls_session_says_so(tls_server, tls_files):
    """SIGTERM: the shutdown notice goes through the relay before the server exits."""
    import os

    sess = rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client())
    os.kill(tls_server.proc.pid, signal.SIGTERM)
    tls_server.proc.wait(10)
    with pytest.raises(kernelrpc.ConnectionLost, match="shutting down"):
        sess.get_function("testing.echo")(1)


def test_server_killed_mid_tls_session_takes_its_relay_along(tls_server, tls_files):
    sess = rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client())
    assert sess.get_function("testing.echo")(1) == 1
    children = _children(tls_server.proc.pid)
    assert len(children) == 2                            # the relay and the session child
    tls_server.stop(signal.SIGKILL)
    wait_until(lambda: all(gone(pid) for pid in children), timeout=10, what="relay and session gone")
    with pytest.raises(kernelrpc.ConnectionLost):
        sess.get_function("testing.echo")(1)


def _children(pid: int, spares: bool = True) -> list[int]:
    """The server's child processes but its forker (server/forker.py); without its spare
    session child (server/spare.py) if not ``spares``."""
    from kernelrpc.server.forker import is_forker
    from kernelrpc.server.process_tree import children
    from kernelrpc.server.spare import is_spare

    return [child for child in children(pid) if not is_forker(child) and (spares or not is_spare(child))]


def test_relays_are_reaped_after_their_sessions(tls_server, tls_files):
    for n in range(3):
        with rpc.connect(tls_server.host, tls_server.port, key="dev", tls=tls_files.client()) as sess:
            assert sess.get_function("testing.echo")(n) == n
    wait_until(lambda: not _children(tls_server.proc.pid, spares=False), timeout=10,
               what="no relay or session child left")


def test_a_session_ending_leaves_the_other_tls_sessions_alone(start_service, tls_files, fixture_module):
    """The server kills the children that ended sessions leave behind; the relays of the
    sessions still running are not among them."""
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--max-sessions", "2",
                                                *tls_files.flags()])
    with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client()) as staying:
        assert staying.get_function("testing.echo")(1) == 1
        with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client()) as leaving:
            module = load_fixture(leaving, fixture_module)
            with pytest.raises(kernelrpc.ServerCrashed):
                module["crash_segv"]()
        with rpc.connect(server.host, server.port, key="dev", tls=tls_files.client()) as other:
            assert other.get_function("testing.echo")(2) == 2
        server.wait_for_line("session from .* finished", timeout=10)
        assert staying.get_function("testing.echo")("still here") == "still here"
