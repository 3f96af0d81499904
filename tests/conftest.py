import pytest

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
