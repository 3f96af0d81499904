import errno
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
