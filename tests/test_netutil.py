import errno
import re
import socket

import pytest

from kernelrpc.netutil import bind_first_free


def test_port_zero_lets_the_os_choose():
    with bind_first_free("127.0.0.1", 0, 0) as sock:
        assert sock.getsockname()[1] > 0


def test_skips_taken_ports_and_reports_an_exhausted_range():
    with bind_first_free("127.0.0.1", 0, 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as info:
            bind_first_free("127.0.0.1", port, port + 1)
        assert info.value.errno == errno.EADDRINUSE
        assert f"[{port}, {port + 1})" in str(info.value)
        try:
            nxt = bind_first_free("127.0.0.1", port, port + 2)
        except OSError:
            pytest.skip("the neighbouring port is taken too")
        with nxt:
            assert nxt.getsockname()[1] == port + 1


def test_ipv6_host_gets_an_ipv6_socket():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        sock = bind_first_free("::1", 0, 0)
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    with sock:
        assert sock.family == socket.AF_INET6


def test_receive_until_feeds_initial_bytes_then_reads_until_a_whole_message():
    from kernelrpc.netutil import receive_until
    from kernelrpc.wire import handshake as hs

    reply = hs.encode_reply(hs.RPC_CODE_SUCCESS, "server:dev") + b"after"
    a, b = socket.socketpair()
    with a, b:
        b.sendall(reply[3:7])
        b.sendall(reply[7:])
        parser = hs.ReplyParser()
        got = receive_until(a, parser, "peer", "the handshake", initial=reply[:3])
        assert (got.code, got.key, parser.unused) == (hs.RPC_CODE_SUCCESS, "server:dev", b"after")


def test_receive_until_names_the_stage_when_the_peer_closes():
    from kernelrpc.errors import ConnectionLost
    from kernelrpc.netutil import receive_until
    from kernelrpc.wire import handshake as hs

    a, b = socket.socketpair()
    with a:
        b.sendall(hs.encode_reply(hs.RPC_CODE_SUCCESS, "x")[:5])
        b.close()
        with pytest.raises(ConnectionLost, match=r"^peer closed the connection during the handshake \(hint\)$"):
            receive_until(a, hs.ReplyParser(), "peer", "the handshake", closed_hint=" (hint)")


def test_keepalive_is_enabled():
    from kernelrpc.netutil import enable_keepalive

    with socket.socket() as sock:
        enable_keepalive(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30


@pytest.mark.parametrize("text, address", [
    ("127.0.0.1:9190", ("127.0.0.1", 9190)),
    ("tracker-host:1", ("tracker-host", 1)),
    ("laptop.local:65535", ("laptop.local", 65535)),
    ("[::1]:9190", ("::1", 9190)),
    ("[fe80::1%eth0]:9190", ("fe80::1%eth0", 9190)),
])
def test_parse_host_port_takes_a_host_or_a_bracketed_ipv6_address(text, address):
    from kernelrpc.netutil import parse_host_port

    assert parse_host_port(text) == address


@pytest.mark.parametrize("text, why", [
    ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:", "expected HOST:PORT"),
    ("[::1]", "expected HOST:PORT"),
    (":9190", "the host is empty"),
    ("[]:9190", "the host is empty"),
    ("::1:9190", "IPv6 address in brackets"),
    ("[::1:9190", "']' is missing"),
    ("[::1]9190", "expected HOST:PORT"),
    ("[tracker]:9190", "not an IPv6 address"),
    ("host:0", "1..65535"),
    ("host:65536", "1..65535"),
    ("host:-1", "1..65535"),
    ("host:+9190", "1..65535"),
    ("host:9190x", "1..65535"),
    ("host:\u0669", "1..65535"),     # an Arabic-Indic digit: str.isdigit, not a port
])
def test_parse_host_port_refuses_naming_the_problem(text, why):
    from kernelrpc.netutil import parse_host_port

    with pytest.raises(ValueError, match=re.escape(why)) as info:
        parse_host_port(text)
    assert repr(text) in str(info.value)
