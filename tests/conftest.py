import pytest

from fixtures.build import build_fixture_module
from servicectl import Service


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
