"""Ctrl-C while the client waits for a reply, over a real server process: the reply would arrive
later and be read as the next request's, so the client closes the session instead, the next
request says it is closed, and a new session with the same server works."""
import signal
import threading

import pytest

from kernelrpc import rpc
from kernelrpc.errors import ConnectionLost


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt here, as in a terminal: a shell's background job (a CI
    runner's, for one) inherits SIGINT ignored, and Python then leaves it ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupted_call_closes_the_session(server, session, sigint_raises):
    sleep = session.get_function("testing.sleep")
    interrupt = threading.Timer(0.3, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    interrupt.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            sleep(2.0)  # blocked in the first read of the reply when the signal comes
    finally:
        interrupt.join()
    assert session.closed
    with pytest.raises(ConnectionLost, match="closed"):
        session.get_function("testing.echo")(1)
    with rpc.connect(server.host, server.port, key="dev") as fresh:
        assert fresh.get_function("testing.echo")(7) == 7
