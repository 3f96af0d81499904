from __future__ import annotations

import os
import time

import pytest

from fixtures.build import build_fixture_module
from kernelrpc import rpc
from servicectl import AUTH_TOKEN, Service, queue, start_server, start_tracker
from tracker_peers import Raw


def wait_until(predicate, timeout: float = 20.0, what: str | None = None, interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy, and return that.

    For state that no log line announces (a tracker's queue, a process's threads); services'
    own announcements are awaited with ``Service.wait_for_line``. Past the deadline it raises an
    AssertionError naming ``what`` (by default where the predicate is written) and the last
    value seen, so a broken behaviour fails the test instead of hanging it.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            code = predicate.__code__
            what = what or f"the condition at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
            raise AssertionError(f"{what} not reached within {timeout} s (last value: {value!r})")
        time.sleep(interval)


@pytest.fixture
def start_service():
    """Factory fixture: ``start_service("kernelrpc.server", [...])``; stops everything it started."""
    started: list[Service] = []

    def start(module: str, args: list[str], **kwargs) -> Service:
        svc = Service(module, args, **kwargs)
        started.append(svc)
        return svc

    yield start
    for svc in reversed(started):
        svc.stop()


@pytest.fixture
def tracker(start_service):
    """A tracker process on a port the OS chose (files that need other flags define their own)."""
    return start_tracker(start_service)


@pytest.fixture
def fleet(start_service, tracker):
    """``(tracker, servers)``: two device servers with key "board", both registered at the tracker."""
    servers = [start_server(start_service, tracker) for _ in range(2)]
    wait_until(lambda: queue(tracker)["free"] == 2, what="both servers registered")
    return tracker, servers


@pytest.fixture
def server(start_service):
    """A device server with key "dev" (files that need other flags define their own)."""
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])


@pytest.fixture
def proxy(start_service):
    """Factory: ``proxy("--timeout-client", "1")`` starts ``python -m kernelrpc.proxy --port 0``."""
    def start(*args: str):
        return start_service("kernelrpc.proxy", ["--port", "0", *args])
    return start


@pytest.fixture
def session(server):
    """A session with ``server``, closed after the test."""
    with rpc.connect(server.host, server.port, key="dev") as sess:
        yield sess


@pytest.fixture
def peers(tracker):
    """Factory fixture: ``peers()`` opens a :class:`tracker_peers.Raw` peer on ``tracker``; all closed after."""
    made = []

    def make(**kw):
        peer = Raw(tracker.address, **kw)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


@pytest.fixture(scope="session")
def fixture_module(tmp_path_factory):
    """Path of tests/fixtures/kernels.c compiled into a kernelrpc module, built once per session."""
    return build_fixture_module(tmp_path_factory.mktemp("fixture_module"))


@pytest.fixture(scope="session")
def thread_probe_module(tmp_path_factory):
    """Path of the module that reports how many tasks and threads its pool ran
    (tests/fixtures/thread_probe.py)."""
    from fixtures.thread_probe import build_thread_probe

    return build_thread_probe(tmp_path_factory.mktemp("thread_probe"))


class TLSFiles:
    """A throw-away CA, a service certificate for 127.0.0.1/localhost and a client certificate."""

    def __init__(self, directory) -> None:
        import trustme

        ca = trustme.CA()
        self.ca = str(directory / "ca.pem")
        self.cert = str(directory / "service.pem")
        self.client_cert = str(directory / "client.pem")
        ca.cert_pem.write_to_path(self.ca)
        ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(self.cert)
        ca.issue_cert("kernelrpc-client@lab").private_key_and_cert_chain_pem.write_to_path(self.client_cert)
        other = trustme.CA()
        self.untrusted_cert = str(directory / "untrusted.pem")
        other.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
            self.untrusted_cert)

    def flags(self, *, client_cert: bool = False) -> list[str]:
        """The command-line flags of a service that accepts (and makes) TLS connections."""
        flags = ["--tls-ca", self.ca, "--tls-cert", self.cert]
        return flags + (["--tls-require-client-cert"] if client_cert else [])

    def client(self, *, with_cert: bool = False):
        from kernelrpc.wire.tls import TLSConfig

        return TLSConfig(cafile=self.ca, certfile=self.client_cert if with_cert else None)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory):
    return TLSFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def token_file(tmp_path):
    """A file holding :data:`servicectl.AUTH_TOKEN`, readable by its owner only."""
    path = tmp_path / "token"
    path.write_text(AUTH_TOKEN + "\n")
    path.chmod(0o600)
    return str(path)
