"""Interop with Apache TVM 0.27: TVM's tools, servers and clients with our tracker, and back."""
import re
import subprocess
import sys

import pytest

from conftest import wait_until
from servicectl import child_env, free_port
from test_tracker_registration import drive
from kernelrpc.rpc.tracker_client import connect_tracker, format_summary
from kernelrpc.server.registration import TrackerRegistration

pytestmark = pytest.mark.tvm
tvm_rpc = pytest.importorskip("tvm.rpc", reason="apache-tvm is not installed", exc_type=ImportError)

TVM_READY = re.compile(r"bind to (\S+):(\d+)")


def tool(module, port):
    return subprocess.run([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port)],
                          capture_output=True, text=True, env=child_env(), timeout=60)


@pytest.fixture
def tvm_server(tracker, start_service):
    port = free_port()
    server = start_service("tvm.exec.rpc_server", [
        "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
        "--tracker", f"127.0.0.1:{tracker.port}", "--key", "tvmkey"], ready=TVM_READY, timeout=60)
    with connect_tracker(*tracker.address) as session:
        wait_until(lambda: session.summary()["queue_info"].get("tvmkey", {}).get("free") == 1,
                   timeout=60, what="TVM's server registered")
    return server


def test_tvm_server_and_client_through_our_tracker(tracker, tvm_server):
    ours, theirs = tool("kernelrpc.query_rpc_tracker", tracker.port), tool("tvm.exec.query_rpc_tracker", tracker.port)
    assert theirs.returncode == 0 and ours.returncode == 0, theirs.stderr + ours.stderr
    assert ours.stdout == theirs.stdout
    assert f"{f'127.0.0.1:{tvm_server.port}':21s}    server:tvmkey\n" in theirs.stdout

    client = tvm_rpc.connect_tracker("127.0.0.1", tracker.port)
    for round_ in range(2):             # the server offers a fresh match key after each session
        remote = client.request("tvmkey", priority=1, session_timeout=20)
        remote.upload(bytearray(b"kernelrpc"), "probe.bin")
        assert bytes(remote.download("probe.bin")) == b"kernelrpc"
        del remote
    with connect_tracker(*tracker.address) as session:
        wait_until(lambda: session.summary()["queue_info"]["tvmkey"]["free"] == 1, what="TVM's server free again")
        assert session.summary()["stats"]["tvmkey"]["matches"] == 2


def test_our_registration_with_tvm_tracker(start_service):
    port = free_port()
    tvm_tracker = start_service("tvm.exec.rpc_tracker", ["--host", "127.0.0.1", "--port", str(port),
                                                         "--port-end", str(port + 1)], ready=TVM_READY, timeout=60)
    reg = TrackerRegistration(tvm_tracker.address, "ourkey", 9321, poll_interval=0.05)
    try:
        drive(reg, lambda: reg.registered)
        session = tvm_rpc.connect_tracker("127.0.0.1", tvm_tracker.port)
        text = session.text_summary()
        assert f"{'127.0.0.1:9321':21s}    server:ourkey\n" in text
        assert "ourkey   1      1     0      \n" in text
        ours = tool("kernelrpc.query_rpc_tracker", tvm_tracker.port)
        assert ours.returncode == 0 and ours.stdout == tool("tvm.exec.query_rpc_tracker", tvm_tracker.port).stdout
        with connect_tracker(*tvm_tracker.address) as mine:
            assert format_summary(mine.summary()) == text
            host, port_, taken = mine.request_address("ourkey", timeout=10)
            assert (host, port_, taken) == ("127.0.0.1", 9321, reg.matchkey)
            drive(reg, lambda: reg.matchkey != taken)    # TVM's tracker has no leases: the server rotates
            assert mine.request_address("ourkey", timeout=10)[2] == reg.matchkey
    finally:
        reg.close()


def test_our_server_through_tvm_tracker(start_service):
    port = free_port()
    tvm_tracker = start_service("tvm.exec.rpc_tracker", ["--host", "127.0.0.1", "--port", str(port),
                                                         "--port-end", str(port + 1)], ready=TVM_READY, timeout=60)
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{port}", "--key", "ours"])
    server.wait_for_line("registered key ours at tracker")
    with connect_tracker(*tvm_tracker.address) as session:
        for round_ in range(2):
            with session.request("ours", session_timeout=30, timeout=30) as sess:
                assert sess.address.endswith(f":{server.port}")
                sess.upload(b"via TVM's tracker", "probe.bin")
                assert sess.download("probe.bin") == b"via TVM's tracker"


def test_tvm_proxy_fleet_through_our_tracker(tracker, start_service):
    """TVM's proxy PUTs several slots on one port before its UPDATE_INFO ("server:proxy[k]")."""
    port = free_port()
    start_service("tvm.exec.rpc_proxy", ["--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
                                         "--web-port", "0", "--tracker", f"127.0.0.1:{tracker.port}"],
                  ready=re.compile(r"RPCProxy: client port bind to (\S+):(\d+)"), timeout=60)
    for _ in range(2):
        start_service("tvm.exec.rpc_server", ["--host", "127.0.0.1", "--port", str(port), "--through-proxy",
                                              "--key", "viaproxy"], ready=re.compile(""), timeout=60)
    with connect_tracker(*tracker.address) as session:
        wait_until(lambda: session.summary()["queue_info"].get("viaproxy", {}).get("free") == 2,
                   timeout=60, what="both TVM servers registered through TVM's proxy")
    theirs = tool("tvm.exec.query_rpc_tracker", tracker.port)
    ours = tool("kernelrpc.query_rpc_tracker", tracker.port).stdout
    proxied = "viaproxy   1      2     0      \n"     # TVM counts the proxy under "proxy[viaproxy]"
    assert proxied in ours and ours.replace(proxied, "") == theirs.stdout
    assert f"{f'127.0.0.1:{port}':21s}    server:proxy[viaproxy]\n" in theirs.stdout
    client = tvm_rpc.connect_tracker("127.0.0.1", tracker.port)
    sessions = [client.request("viaproxy", session_timeout=20) for _ in range(2)]
    for i, remote in enumerate(sessions):
        remote.upload(bytearray(b"proxy %d" % i), "probe.bin")
        assert bytes(remote.download("probe.bin")) == b"proxy %d" % i
