"""Socket helpers shared by the services (stdlib only, so the device server can use them)."""
from __future__ import annotations

import errno
import os
import socket

from .errors import ConnectionLost


def bind_first_free(host: str, port: int, port_end: int, backlog: int = 128) -> socket.socket:
    """Listen on the first free port in ``[port, port_end)``; ``port=0`` lets the OS choose.

    The address family follows ``host`` (IPv4, IPv6 or a name). Raises ``OSError`` with
    ``EADDRINUSE`` and the range in the message when every port is taken.
    """
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    family = infos[0][0] if infos else socket.AF_INET
    candidates = [0] if port == 0 else range(port, max(port_end, port + 1))
    last_error: OSError | None = None
    for candidate in candidates:
        sock = socket.socket(family, socket.SOCK_STREAM)
        if os.name != "nt":  # on Windows SO_REUSEADDR lets two live sockets share a port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError as exc:
            sock.close()
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                raise OSError(exc.errno, f"cannot bind {host}:{candidate}: {exc.strerror}") from None
            last_error = exc
            continue
        sock.listen(backlog)
        return sock
    raise OSError(errno.EADDRINUSE, f"no free port in [{port}, {port_end}) on {host}: {last_error}")


KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
"""Probe after 30 s idle, every 10 s, give up after 3: a vanished peer is noticed in about a minute."""


def parse_host_port(text: str) -> tuple[str, int]:
    """``(host, port)`` of ``"HOST:PORT"`` or ``"[IPV6]:PORT"`` (the brackets dropped), the port in
    1..65535: the address of a service to connect to (a tracker, a proxy).

    Raises:
        ValueError: no port, an empty host, an IPv6 address without brackets (``::1:9190``
            could be either) or a port outside the range; the message says which.
    """
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed:
            raise ValueError(f"{text!r}: the IPv6 address's ']' is missing, as in [::1]:9190")
        if host and not _is_ipv6(host):
            raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address")
        sep, port = rest[:1], rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host or "]" in host:
            raise ValueError(f"{text!r}: write an IPv6 address in brackets, as [::1]:9190")
    if sep != ":" or not port:
        raise ValueError(f"{text!r}: expected HOST:PORT (an IPv6 address as [::1]:9190)")
    if not host:
        raise ValueError(f"{text!r}: the host is empty (expected HOST:PORT, e.g. 127.0.0.1:9190)")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port must be a number in 1..65535")
    return host, int(port)


def _is_ipv6(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, host.partition("%")[0])   # a zone (%eth0) is the OS's to check
    except (OSError, ValueError):
        return False
    return True


def enable_keepalive(sock: socket.socket) -> None:
    """TCP keepalive with :data:`KEEPALIVE`: notices peers that vanish without closing (a NAT box
    rebooted) and keeps NAT mappings open while a connection waits."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in KEEPALIVE:
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def receive_until(sock: socket.socket, parser, where: str, stage: str, initial: bytes = b"",
                  bufsize: int = 65536, closed_hint: str = ""):
    """Feed ``parser`` what ``sock`` receives until its ``feed`` returns a message (anything but
    None), and return that; ``initial`` (bytes that arrived before) is fed first.

    Raises:
        ConnectionLost: the peer closed (``closed_hint`` is added to the message) or the
            connection broke before a whole message arrived; ``where`` and ``stage`` say which.
        socket.timeout: as the socket raised it.
    """
    message = parser.feed(initial) if initial else None
    while message is None:
        try:
            data = sock.recv(bufsize)
        except socket.timeout:
            raise
        except OSError as exc:
            raise ConnectionLost(f"{where}: connection lost during {stage}: {exc}") from exc
        if not data:
            raise ConnectionLost(f"{where} closed the connection during {stage}{closed_hint}")
        message = parser.feed(data)
    return message
