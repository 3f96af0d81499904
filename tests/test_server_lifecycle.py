"""The device server as a process: ports, keys, crashes, timeouts, silent and foreign peers."""
import re
import signal
import socket
import struct
import time

import pytest

import kernelrpc
from kernelrpc import rpc
from kernelrpc.wire import handshake as H
from kernelrpc.wire import protocol as P
from kernelrpc.wire.hello import encode_hello


def start_server(start_service, *extra):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", *extra])


def load_fixture(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


def assert_serves(server):
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.get_function("testing.echo")("still serving") == "still serving"


def test_binds_first_free_port_of_the_range(start_service):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        server = start_service("kernelrpc.server", ["--port", str(port), "--port-end", str(port + 40)])
    except RuntimeError:
        pytest.skip("no free port right after the taken one")
    finally:
        taken.close()
    assert any(re.fullmatch(r"kernelrpc\.server listening on 127\.0\.0\.1:\d+", line) for line in server.lines)
    assert port < server.port < port + 40


@pytest.mark.parametrize("function, sig, code", [
    ("crash_segv", signal.SIGSEGV, None), ("crash_abort", signal.SIGABRT, None), ("exit_now", None, 3)])
def test_crash_reaches_client_and_server_goes_on(start_service, fixture_module, function, sig, code):
    server = start_server(start_service)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        module = load_fixture(sess, fixture_module)
        with pytest.raises(kernelrpc.ServerCrashed) as info:
            module[function]()
        assert info.value.signal == sig and info.value.exit_code == code
        with pytest.raises(kernelrpc.ConnectionLost):
            sess.get_function("testing.echo")
    assert_serves(server)


def test_client_session_timeout_kills_the_session(start_service, fixture_module):
    server = start_server(start_service)
    with rpc.connect(server.host, server.port, key="dev", session_timeout=1) as sess:
        module = load_fixture(sess, fixture_module)
        started = time.monotonic()
        with pytest.raises(kernelrpc.SessionTimeout, match="1s session has expired"):
            module["sleep_ms"](60_000)
        assert time.monotonic() - started < 60          # ended by the timeout, not by the kernel
    assert_serves(server)


def test_server_session_timeout(start_service):
    server = start_server(start_service, "--session-timeout", "1")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["session_timeout"] == 1
        with pytest.raises(kernelrpc.SessionTimeout):
            sess.get_function("testing.sleep")(60)
    assert_serves(server)


def test_wrong_key_is_refused(start_service):
    server = start_server(start_service)
    with pytest.raises(kernelrpc.HandshakeError, match="MISMATCH"):
        rpc.connect(server.host, server.port, key="other")
    assert_serves(server)


def still_open(sock):
    """The server has not closed ``sock`` (reads nothing and does not wait)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True


def test_silent_and_half_open_peers_do_not_hold_up_others(start_service):
    server = start_server(start_service, "--handshake-timeout", "30")
    silent = socket.create_connection(server.address)
    half = socket.create_connection(server.address)
    half.sendall(H.encode_preamble("client:dev")[:6])
    try:
        assert_serves(server)
        assert still_open(silent) and still_open(half)  # served while those two still wait
    finally:
        silent.close()
        half.close()


def test_a_flood_of_silent_connections_cannot_lock_clients_out(start_service):
    server = start_server(start_service, "--handshake-timeout", "60", "--max-pending", "4")
    flood = [socket.create_connection(server.address) for _ in range(12)]
    try:
        for sock in flood[:8]:  # the oldest unfinished handshakes were dropped to make room
            sock.settimeout(10)
            assert sock.recv(1) == b""
        assert_serves(server)
        assert server.wait_for_line("too many unfinished handshakes")
    finally:
        for sock in flood:
            sock.close()


def test_silent_peer_is_dropped_at_the_handshake_deadline(start_service):
    server = start_server(start_service, "--handshake-timeout", "0.5")
    with socket.create_connection(server.address) as silent:
        silent.settimeout(10)
        assert silent.recv(1) == b""


def test_sessions_queue_one_at_a_time(start_service):
    server = start_server(start_service)
    first = rpc.connect(server.host, server.port, key="dev")
    try:
        with pytest.raises(kernelrpc.ConnectTimeout):
            rpc.connect(server.host, server.port, key="dev", connect_timeout=0.5)
    finally:
        first.close()
    assert_serves(server)


def _raw_session(server, hello: bytes) -> bytes:
    """Handshake, then send ``hello``; return everything the server sends until it closes."""
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(H.encode_preamble("client:dev"))
        parser = H.ReplyParser()
        reply = None
        while reply is None:
            chunk = sock.recv(4096)
            assert chunk, "the server closed before its handshake reply"
            reply = parser.feed(chunk)
        assert reply.ok
        sock.sendall(hello)
        chunks = [parser.unused]
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _tvm_exception_text(data: bytes) -> str:
    nbytes, code, nargs, type_index, n = struct.unpack_from("<QiiiQ", data)
    assert code == 5 and nargs == 1 and type_index == 8 and nbytes == len(data) - 8
    return data[28:28 + n].decode()


def test_tvm_client_hello_gets_an_error_naming_both_versions(start_service):
    server = start_server(start_service)
    tvm_init_server = bytes.fromhex("1500000000000000 02000000 0500000000000000 302e382e30 00000000")
    text = _tvm_exception_text(_raw_session(server, tvm_init_server))
    assert "kernelrpc/1" in text and "TVM RPC protocol 0.8.0" in text
    assert_serves(server)


def test_other_kernelrpc_version_gets_an_error_naming_both_versions(start_service):
    server = start_server(start_service)
    text = _tvm_exception_text(_raw_session(server, encode_hello("kernelrpc/0")))
    assert "kernelrpc/1" in text and "kernelrpc/0" in text


def test_garbage_after_handshake_is_refused_not_hung(start_service):
    server = start_server(start_service)
    text = _tvm_exception_text(_raw_session(server, b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64))
    assert "neither kernelrpc's nor TVM's session protocol" in text
    assert_serves(server)


def test_oversized_frame_ends_the_session_with_an_error(start_service):
    server = start_server(start_service, "--max-frame-bytes", "4096")
    with rpc.connect(server.host, server.port, key="dev") as sess:
        assert sess.info["max_frame_bytes"] == 4096
        echo = sess.get_function("testing.echo")
        with pytest.raises(ValueError, match="frame limit of 4096"):   # our client refuses it locally
            echo(b"x" * 10_000)
        sess._conn.send(P.encode_call(echo._id, [b"x" * 10_000]))       # a client that sends it anyway
        with pytest.raises(kernelrpc.RemoteError, match="exceeds the limit of 4096"):
            echo(1)
    assert_serves(server)


@pytest.mark.parametrize("body", [bytes([P.CALL]) + b"\xff\xff\xff\xff\x09",
                                  P.encode_request(P.CALL, [1, 2])[P.HEADER_SIZE:]],
                         ids=["bad count", "no function handle"])
def test_garbage_frames_end_only_that_session(start_service, body):
    server = start_server(start_service)
    sess = rpc.connect(server.host, server.port, key="dev")
    sess._conn.send(P.encode_frame(P.REQUEST, body))
    with pytest.raises(kernelrpc.RemoteError, match="ProtocolError"):
        sess._expect(sess._receive(), P.RETURN)
    sess.close()
    assert_serves(server)


@pytest.mark.tvm
def test_real_tvm_client_gets_a_clear_error(start_service):
    tvm_rpc = pytest.importorskip("tvm.rpc")
    server = start_server(start_service)
    with pytest.raises(Exception) as info:
        tvm_rpc.connect(server.host, server.port, key="dev")
    assert "kernelrpc/1" in str(info.value) and "0.8.0" in str(info.value)
    assert_serves(server)


@pytest.mark.tvm
def test_our_client_on_a_tvm_server_gets_a_clear_error(start_service):
    pytest.importorskip("tvm.rpc")
    tvm_server = start_service("tvm.exec.rpc_server", ["--host", "127.0.0.1", "--port", "9500", "--port-end", "9600"],
                               ready=re.compile(r"bind to (\S+):(\d+)"))
    with pytest.raises(kernelrpc.VersionMismatch) as info:
        rpc.connect(tvm_server.host, tvm_server.port, connect_timeout=20)
    assert "kernelrpc/1" in str(info.value) and "TVM" in str(info.value)


def test_max_sessions_allows_concurrent_sessions(start_service):
    server = start_server(start_service, "--max-sessions", "2")
    with rpc.connect(server.host, server.port, key="dev") as first, \
            rpc.connect(server.host, server.port, key="dev", connect_timeout=5) as second:
        assert first.info["pid"] != second.info["pid"]
        assert second.get_function("testing.echo")(2) == 2
