"""The tracker's tables, queue-wait reports and request_and_run against Apache TVM's tracker,
which lists neither leases nor waiting requests."""
import re

import pytest

from kernelrpc import rpc
from notebook_helpers import request_behind
from servicectl import free_port

pytestmark = pytest.mark.tvm
pytest.importorskip("tvm.rpc", reason="apache-tvm is not installed", exc_type=ImportError)

TVM_READY = re.compile(r"bind to (\S+):(\d+)")


@pytest.fixture
def tvm_fleet(start_service):
    port = free_port()
    tracker = start_service("tvm.exec.rpc_tracker", ["--host", "127.0.0.1", "--port", str(port),
                                                     "--port-end", str(port + 1)],
                            ready=TVM_READY, timeout=60)
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{port}",
                                                "--key", "ours"])
    server.wait_for_line("registered key ours at tracker")
    return tracker, server


def test_tables_queue_state_and_request_and_run_with_tvm_tracker(tvm_fleet):
    tracker, server = tvm_fleet
    with rpc.connect_tracker(*tracker.address) as trk:
        text = str(trk.summary_table())
        assert re.search(rf"127\.0\.0\.1:{server.port}\s+ours\s+-\n", text + "\n")  # holder unknown
        assert trk.request_and_run("ours", lambda remote: remote.get_function("testing.echo")(3),
                                   session_timeout=30) == 3

        holder = trk.request("ours", session_timeout=60)
        waiter = rpc.connect_tracker(*tracker.address)
        states, session = request_behind(holder, waiter, "ours")
        assert session.get_function("testing.echo")("next") == "next"
        session.close()
        waiter.close()
    state = states[0]
    assert (state.position, state.waiting, state.servers, state.free, state.holders) == (None, 1, 1, 0, [])
    assert str(state) == "1 waiting; 1 board, 0 free"
