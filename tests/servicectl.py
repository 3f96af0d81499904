"""The tests start services through :mod:`kernelrpc.deploy.launch`, as the demo does; the helpers
here are the ones many test files share."""
import socket

from kernelrpc.deploy.launch import READY, SRC, Service, child_env
from kernelrpc.rpc.tracker_client import connect_tracker

AUTH_TOKEN = "lab-token-0123456789abcdef"
"""The shared secret of the authentication tests (the ``token_file`` fixture holds it)."""

__all__ = ["READY", "SRC", "Service", "child_env", "free_port", "gone", "queue", "start_server", "start_tracker"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_tracker(start_service, port=None):
    args = ["--port", "0"] if port is None else ["--port", str(port), "--port-end", str(port + 1)]
    return start_service("kernelrpc.tracker", args)


def start_server(start_service, tracker, key="board"):
    return start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                              "--key", key])


def queue(tracker, key="board"):
    """The tracker's queue for ``key``: ``{"free": n, "pending": m}`` (zeros when it has none)."""
    with connect_tracker(*tracker.address) as session:
        return session.summary()["queue_info"].get(key, {"free": 0, "pending": 0})


def gone(pid: int) -> bool:
    """The process has exited (or is a zombie: exited, not yet reaped; or dead, being reaped)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and line.split()[1] in ("Z", "X") for line in f)
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it exited between the open and the read
        return True


