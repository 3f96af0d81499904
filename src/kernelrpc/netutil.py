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
