"""kernelrpc sessions through proxies: our device server connects out, our client connects in."""
from __future__ import annotations

import re
import signal
import socket

import numpy as np
import pytest

from kernelrpc import nd, rpc
from conftest import wait_until
from kernelrpc.errors import SessionTimeout
from proxy_peers import (offered_matchkey, start_tvm_proxy, start_tvm_tracker, tracker_request,
                         wait_for_matches)

DEVICE_READY = re.compile(r"connected to proxy (\S+):(\d+)")


@pytest.fixture
def device(start_service):
    """``python -m kernelrpc.server --through-proxy``; ready once it has connected out."""
    def start(host, port, key="dev", *args):
        return start_service("kernelrpc.server", ["--through-proxy", "--host", host, "--port",
                                                  str(port), "--key", key, *args],
                             ready=DEVICE_READY)
    return start


def check_session(sess) -> None:
    assert sess.get_function("testing.echo")("through") == "through"
    source = np.random.default_rng(1).standard_normal((256, 1024)).astype("float32")
    remote = nd.array(source, sess.cpu(0))
    np.testing.assert_array_equal(remote.numpy(), source)
    sess.upload(b"\x01\x02" * 50000, "blob.bin")
    assert sess.download("blob.bin") == b"\x01\x02" * 50000


def test_our_server_through_our_proxy_serves_session_after_session(proxy, device):
    p = proxy()
    dev = device(p.host, p.port)
    assert dev.address == p.address
    for nth in (1, 2):
        offered_matchkey(p, "dev", nth)  # the device connects out again after each session
        with rpc.connect(p.host, p.port, key="dev") as sess:
            check_session(sess)
    dev.wait_for_line("finished")


def test_client_session_timeout_reaches_the_device_through_the_proxy(proxy, device):
    p = proxy()
    device(p.host, p.port)
    with rpc.connect(p.host, p.port, key="dev", session_timeout=1) as sess:
        with pytest.raises(SessionTimeout):
            sess.get_function("testing.sleep")(5)
    wait_for_matches(p, r"paired client .*'client:dev -timeout=1'")


def test_device_reconnects_when_the_proxy_restarts(start_service, device):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["--port", str(port), "--port-end", str(port + 1)]
    first = start_service("kernelrpc.proxy", args)
    dev = device(first.host, port)
    offered_matchkey(first, "dev")
    first.stop(signal.SIGKILL)
    dev.wait_for_line("unreachable or gone")
    second = start_service("kernelrpc.proxy", args)
    offered_matchkey(second, "dev")
    with rpc.connect(second.host, port, key="dev") as sess:
        check_session(sess)


def test_two_of_our_devices_with_one_key_serve_two_clients_at_once(proxy, device):
    p = proxy()
    device(p.host, p.port)
    device(p.host, p.port)
    offered_matchkey(p, "dev", 2)
    with rpc.connect(p.host, p.port, key="dev") as a, rpc.connect(p.host, p.port, key="dev") as b:
        check_session(a)
        check_session(b)


@pytest.mark.tvm
def test_our_session_through_tvm_tracker_and_our_proxy(start_service, proxy, device):
    pytest.importorskip("tvm", reason="apache-tvm is not installed")
    tracker = start_tvm_tracker(start_service)
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}")
    device(p.host, p.port, "trk")
    wait_for_matches(p, r"offered trk:\S+ to the tracker")
    host, port, matchkey = tracker_request(tracker.address, "trk")
    assert port == p.port
    with rpc.connect(host, port, key=matchkey) as sess:
        check_session(sess)


@pytest.mark.tvm
def test_our_session_through_tvm_proxy(start_service, device):
    pytest.importorskip("tvm", reason="apache-tvm is not installed")
    tvm_proxy = start_tvm_proxy(start_service)
    device(tvm_proxy.host, tvm_proxy.port, "viatvm")
    wait_for_matches(tvm_proxy, "Handler ready")
    with rpc.connect(tvm_proxy.host, tvm_proxy.port, key="viatvm") as sess:
        check_session(sess)


@pytest.fixture
def our_tracker(start_service):
    return lambda *args: start_service("kernelrpc.tracker", ["--port", "0", *args])


def test_connect_tracker_request_reaches_our_device_behind_our_proxy(our_tracker, proxy, device):
    from kernelrpc.rpc import connect_tracker
    tracker = our_tracker()
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}")
    device(p.host, p.port, "behind")
    device(p.host, p.port, "behind")
    wait_for_matches(p, r"offered behind:\S+ to the tracker", 2)
    session = connect_tracker(tracker.host, tracker.port)
    # the proxy logs an offer when it sends it; the tracker's queue shows it once it read it
    wait_until(lambda: session.summary()["queue_info"].get("behind", {}).get("free") == 2,
               what="both devices free in the tracker's queue")
    with session.request("behind", session_timeout=60) as a, \
            session.request("behind", session_timeout=60) as b:
        check_session(a)
        check_session(b)
    wait_for_matches(p, r"paired client .*'client:behind:0\.\d+ -timeout=60'", 2)


def test_proxy_custom_addr_is_what_the_tracker_hands_out(our_tracker, proxy, device):
    from kernelrpc.rpc import connect_tracker
    tracker = our_tracker()
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}", "--custom-addr", "localhost")
    device(p.host, p.port, "nat")
    wait_for_matches(p, r"offered nat:\S+ to the tracker", 1)
    session = connect_tracker(tracker.host, tracker.port)
    # the line says the proxy sent its UPDATE_INFO and PUT, not that the tracker has read them
    addrs = wait_until(lambda: [s["addr"] for s in session.summary()["server_info"]
                                if s["key"] == "server:proxy[nat]"])
    assert addrs == [["localhost", p.port]]
    with session.request("nat", session_timeout=60) as sess:  # handed out as localhost:port
        check_session(sess)


def test_proxy_re_registers_its_devices_when_the_tracker_restarts(start_service, proxy, device):
    from kernelrpc.rpc import connect_tracker
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["--port", str(port), "--port-end", str(port + 1)]
    first = start_service("kernelrpc.tracker", args)
    p = proxy("--tracker", f"127.0.0.1:{port}")
    device(p.host, p.port, "again")
    wait_for_matches(p, r"offered again:\S+ to the tracker")
    first.stop(signal.SIGKILL)
    wait_for_matches(p, r"lost the connection to tracker 127\.0\.0\.1:\d+ .*reconnecting")
    second = start_service("kernelrpc.tracker", args)
    wait_for_matches(p, r"offered again:\S+ to the tracker", 2)
    with connect_tracker(second.host, second.port).request("again") as sess:
        check_session(sess)


def test_a_client_asking_for_a_key_nobody_offers_gets_a_clear_error(proxy):
    from kernelrpc.errors import HandshakeError
    p = proxy("--timeout-client", "1")
    with pytest.raises(HandshakeError, match="MISMATCH.*no device with that key"):
        rpc.connect(p.host, p.port, key="nobody")


def test_device_reconnects_at_once_when_the_proxy_ends_its_wait(proxy, device):
    p = proxy("--timeout-server", "1")
    dev = device(p.host, p.port)
    dev.wait_for_line("ended the wait")
    offered_matchkey(p, "dev", 2)
    with rpc.connect(p.host, p.port, key="dev") as sess:
        check_session(sess)
