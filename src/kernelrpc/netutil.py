"""Socket helpers shared by the services (stdlib only, so the device server can use them)."""
from __future__ import annotations

import errno
import os
import socket


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
