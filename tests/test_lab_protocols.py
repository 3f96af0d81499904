"""TVM's and kernelrpc's servers and clients on one tracker, and the request warnings."""
import logging
import re

import pytest

from conftest import wait_until
from servicectl import free_port
from kernelrpc.errors import QueueTimeout
from kernelrpc.wire.protocol import VERSION_STRING
from kernelrpc.rpc.tracker_client import connect_tracker

TVM_READY = re.compile(r"bind to (\S+):(\d+)")


def free_slots(tracker, key):
    with connect_tracker(*tracker.address) as session:
        return session.summary()["protocols"].get(key, {})


def tvm_server(start_service, tracker_port, key):
    port = free_port()
    return start_service("tvm.exec.rpc_server", [
        "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1),
        "--tracker", f"127.0.0.1:{tracker_port}", "--key", key], ready=TVM_READY, timeout=60)


@pytest.mark.tvm
def test_tvm_and_kernelrpc_share_a_tracker_and_a_key(start_service, tracker):
    tvm_rpc = pytest.importorskip("tvm.rpc", reason="apache-tvm is not installed", exc_type=ImportError)
    theirs = tvm_server(start_service, tracker.port, "shared")
    ours = start_service("kernelrpc.server", ["--port", "0", "--key", "shared",
                                              "--tracker", f"127.0.0.1:{tracker.port}"])
    wait_until(lambda: free_slots(tracker, "shared") == {"tvm": {"free": 1, "pending": 0},
                                                         VERSION_STRING: {"free": 1, "pending": 0}}, timeout=60)
    with connect_tracker(*tracker.address) as session:
        info = session.summary()
        assert sorted(str(s.get("protocol")) for s in info["server_info"]) == ["None", VERSION_STRING]

    client = tvm_rpc.connect_tracker("127.0.0.1", tracker.port)
    for round_ in range(3):     # FIFO would hand out our server every other time
        remote = client.request("shared", priority=1, session_timeout=20, max_retry=1)
        remote.upload(bytearray(b"tvm %d" % round_), "probe.bin")
        assert bytes(remote.download("probe.bin")) == b"tvm %d" % round_
        del remote
        wait_until(lambda: free_slots(tracker, "shared").get("tvm", {}).get("free") == 1, timeout=30)
    with connect_tracker(*tracker.address) as session:
        for round_ in range(2):
            with session.request("shared", session_timeout=20, timeout=20, max_retry=1) as sess:
                assert sess.address == f"127.0.0.1:{ours.port}"
    # both sessions' lines are read from the server's output in the background: wait for them
    wait_until(lambda: len([line for line in ours.lines if "session from" in line and "finished" in line]) == 2,
               what="both sessions on our server finished")
    assert len([line for line in ours.lines if "session for" in line and "starts" in line]) == 2, ours.lines
    assert not [line for line in ours.lines + theirs.lines if "mismatch" in line.lower()]


def test_key_with_a_colon_is_not_reported_missing(start_service, tracker, caplog):
    key = "127.0.0.1:5555"           # TVM's own tests use such keys
    start_service("kernelrpc.server", ["--port", "0", "--key", key, "--tracker", f"127.0.0.1:{tracker.port}"])
    wait_until(lambda: free_slots(tracker, key).get(VERSION_STRING, {}).get("free") == 1)
    with connect_tracker(*tracker.address) as session, session.request(key, session_timeout=20, timeout=20):
        with caplog.at_level(logging.WARNING, "kernelrpc.rpc.tracker_client"), pytest.raises(QueueTimeout):
            session.request(key, timeout=0.3)            # the one server is busy: a wait, not a missing key
        assert "no server with key" not in caplog.text
        text = session.text_summary()
        assert re.search(r"^127\.0\.0\.1:5555\s+1\s+0\s+0\s*$", text, re.M), text


def test_missing_key_warning_names_keys_behind_a_proxy(start_service, tracker, caplog):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}"])
    start_service("kernelrpc.server", ["--through-proxy", "--port", str(proxy.port), "--key", "rpi4"],
                  ready=re.compile("connected to proxy"))
    wait_until(lambda: free_slots(tracker, "rpi4").get(VERSION_STRING, {}).get("free") == 1)
    with connect_tracker(*tracker.address) as session:
        with caplog.at_level(logging.WARNING, "kernelrpc.rpc.tracker_client"), pytest.raises(QueueTimeout):
            session.request("rpi5", timeout=0.3)
        assert "no server with key 'rpi5'" in caplog.text and "(keys with servers: rpi4)" in caplog.text
        with session.request("rpi4", session_timeout=20, timeout=20) as sess:   # marked by the proxy
            assert sess.address == f"127.0.0.1:{proxy.port}"


@pytest.mark.tvm
@pytest.mark.parametrize("tracker_module", ["kernelrpc.tracker", "tvm.exec.rpc_tracker"])
def test_kernelrpc_client_warns_when_only_tvm_servers_have_the_key(start_service, tracker_module, caplog):
    pytest.importorskip("tvm.rpc", reason="apache-tvm is not installed", exc_type=ImportError)
    port = free_port()
    if tracker_module == "kernelrpc.tracker":
        tracker = start_service(tracker_module, ["--port", str(port)])
    else:
        tracker = start_service(tracker_module, ["--host", "127.0.0.1", "--port", str(port),
                                                 "--port-end", str(port + 1)], ready=TVM_READY, timeout=60)
    tvm_server(start_service, port, "tvmonly")
    with connect_tracker("127.0.0.1", port) as session:
        wait_until(lambda: session.summary()["queue_info"].get("tvmonly", {}).get("free") == 1, timeout=60)
        with caplog.at_level(logging.WARNING, "kernelrpc.rpc.tracker_client"):
            if tracker_module == "kernelrpc.tracker":
                with pytest.raises(QueueTimeout):       # never handed a server it cannot talk to
                    session.request("tvmonly", timeout=0.5)
            else:
                with pytest.raises(Exception):          # TVM's tracker cannot tell: hence the warning
                    session.request("tvmonly", timeout=5, max_retry=1)
        assert "the servers with key 'tvmonly'" in caplog.text and "are not kernelrpc servers" in caplog.text
        assert "different keys" in caplog.text


def test_tracker_says_why_a_tvm_request_waits(start_service, tracker):
    from tracker_peers import Raw
    start_service("kernelrpc.server", ["--port", "0", "--key", "onlyours", "--tracker", f"127.0.0.1:{tracker.port}"])
    wait_until(lambda: free_slots(tracker, "onlyours").get(VERSION_STRING, {}).get("free") == 1)
    tvm_client = Raw(tracker.address)
    tvm_client.send([4, "onlyours", "", 1])            # what TVM's TrackerSession.request sends
    tracker.wait_for_line("waits for a tvm server with key 'onlyours'; free ones speak kernelrpc/1 only")
    assert free_slots(tracker, "onlyours") == {"tvm": {"free": 0, "pending": 1},
                                               VERSION_STRING: {"free": 1, "pending": 0}}
    tvm_client.close()
