"""Services whose accept() fails with EMFILE neither spin nor die, and serve again afterwards.

Each service runs with a lowered RLIMIT_NOFILE; a flood of connections uses up its
descriptors so that accept() fails while more connections wait in the backlog.
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import time

import pytest

from kernelrpc import rpc
from proxy_peers import connect, read_reply
from servicectl import queue

FD_LIMIT = 64
FLOOD = 120
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads CPU time from /proc")

SHORTAGE = "failed: [Errno 24] Too many open files; retrying every"


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _flood(address):
    """Connections enough to exhaust the service's descriptors; closed on exit."""
    socks = []
    try:
        for _ in range(FLOOD):
            socks.append(socket.create_connection(address, timeout=10))
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _exhaust_and_recover(start_service, module: str, args: list[str]):
    """Start ``module`` with few descriptors and use them all up: while they are short it logs
    one line, uses little CPU and stays alive; once the flood closes it accepts again."""
    service = start_service(module, ["--port", "0", *args], preexec_fn=_low_fd_limit)
    with _flood(service.address):
        service.wait_for_line(re.escape(SHORTAGE))
        before = _cpu_seconds(service.proc.pid)
        time.sleep(1.0)  # a spinning accept loop burns the whole second; retrying every 0.1 s, next to none
        used = _cpu_seconds(service.proc.pid) - before
        assert service.proc.poll() is None
        assert used < 0.5, f"{used:.2f} s of CPU in 1 s of EMFILE: the accept loop spins"
        assert sum(SHORTAGE in line for line in service.lines) == 1, "\n".join(service.lines)
    service.wait_for_line("accepting on .* again after")
    return service


def test_server_rides_out_emfile(start_service):
    server = _exhaust_and_recover(start_service, "kernelrpc.server", ["--key", "dev"])
    with rpc.connect(*server.address, key="dev", session_timeout=20) as remote:
        assert remote.array([1.0, 2.0]).numpy().tolist() == [1.0, 2.0]


def test_proxy_rides_out_emfile(start_service):
    proxy = _exhaust_and_recover(start_service, "kernelrpc.proxy", [])
    with connect(proxy.address, "server:again") as device, connect(proxy.address, "client:again") as client:
        assert read_reply(client)[0].key == "server:again"
        assert read_reply(device)[0].key == "client:again"


def test_tracker_rides_out_emfile(start_service):
    tracker = _exhaust_and_recover(start_service, "kernelrpc.tracker", [])
    assert queue(tracker) == {"free": 0, "pending": 0}
