"""Our proxy with unmodified Apache TVM peers: TVM device servers, clients and tracker."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import wait_until
from kernelrpc.wire import handshake as hs
from proxy_peers import (connect, offered_matchkey, read_reply, recv_exactly, start_tvm_proxy,
                         start_tvm_tracker, tracker_free_slots, tracker_request, wait_for_matches)
from servicectl import child_env

pytestmark = pytest.mark.tvm
pytest.importorskip("tvm", reason="apache-tvm is not installed")

TVM_SESSION = r"""
import sys
import numpy as np
import tvm
from tvm import rpc
host, port, key, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if mode == "tracker":
    remote = rpc.connect_tracker(host, port).request(key, session_timeout=60)
else:
    remote = rpc.connect(host, port, key=key, session_timeout=60)
blob = bytearray(range(256)) * 4096
remote.upload(blob, "blob.bin")
assert remote.download("blob.bin") == blob
x = np.arange(1 << 20, dtype="float32")
assert (tvm.runtime.tensor(x, remote.cpu(0)).numpy() == x).all()
print("session ok")
"""
_ANY_LINE = re.compile("")  # a TVM device prints no bind line; it is ready once the proxy logs it


def run_tvm_session(host, port, key, mode="direct") -> str:
    out = subprocess.run([sys.executable, "-c", TVM_SESSION, host, str(port), key, mode],
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture
def tvm_device(start_service):
    """A TVM ``rpc_server --through-proxy``; ready once our proxy logs it waiting."""
    def start(proxy_svc, key: str, nth: int = 1):
        svc = start_service("tvm.exec.rpc_server",
                            ["--through-proxy", "--host", proxy_svc.host, "--port",
                             str(proxy_svc.port), "--key", key], ready=_ANY_LINE)
        offered_matchkey(proxy_svc, key, nth)
        return svc
    return start




def test_tvm_device_and_tvm_client_through_our_proxy(proxy, tvm_device):
    p = proxy()
    tvm_device(p, "tvmdev")
    assert "session ok" in run_tvm_session(p.host, p.port, "tvmdev")
    wait_for_matches(p, r"paired client .*'client:tvmdev -timeout=60'.*'server:tvmdev'")
    # the TVM device connects out again after its session and is usable again
    offered_matchkey(p, "tvmdev", 2)
    assert "session ok" in run_tvm_session(p.host, p.port, "tvmdev")


def test_two_tvm_devices_with_one_key_serve_two_clients_at_once(proxy, tvm_device):
    p = proxy()
    tvm_device(p, "pair", 1)
    tvm_device(p, "pair", 2)
    procs = [subprocess.Popen([sys.executable, "-c", TVM_SESSION, p.host, str(p.port), "pair",
                               "direct"], env=child_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert all("session ok" in out for out in outs), outs
    devices = {m.group(1) for m in wait_for_matches(p, r"with device (\S+)", 2)}
    assert len(devices) == 2


def test_tvm_client_reaches_tvm_device_via_tvm_tracker_and_our_proxy(start_service, proxy,
                                                                     tvm_device):
    tracker = start_tvm_tracker(start_service)
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}")
    tvm_device(p, "viatracker")
    wait_for_matches(p, "registered with tracker")
    assert "session ok" in run_tvm_session(tracker.host, tracker.port, "viatracker", "tracker")
    # the client used the tracker-issued match key, not the plain key
    wait_for_matches(p, r"paired client .*'client:viatracker:0\.\d+ -timeout=60'")
    summary = subprocess.run([sys.executable, "-m", "tvm.exec.query_rpc_tracker", "--host",
                              tracker.host, "--port", str(tracker.port)], env=child_env(),
                             capture_output=True, text=True, timeout=60).stdout
    assert "server:proxy[viatracker]" in summary


def test_tvm_proxy_pairs_our_handshake_peers(start_service):
    tvm_proxy = start_tvm_proxy(start_service)
    device = connect(tvm_proxy.address, "server:ours")
    wait_for_matches(tvm_proxy, "Handler ready")
    client = connect(tvm_proxy.address, "client:ours -timeout=7")
    assert read_reply(client)[0].key == "server:ours"
    assert read_reply(device)[0].key == "client:ours -timeout=7"
    client.sendall(b"ping" * 1000)
    assert recv_exactly(device, 4000) == b"ping" * 1000


def test_slots_of_devices_that_left_are_withdrawn_from_the_tracker(start_service, proxy):
    tracker = start_tvm_tracker(start_service)
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}")
    wait_for_matches(p, "registered with tracker")
    devices = [connect(p.address, "server:wd") for _ in range(2)]
    wait_for_matches(p, r"offered wd:\S+ to the tracker", 2)
    assert tracker_free_slots(tracker.address, "wd") == 2
    devices[0].close()  # leaves while offered
    client = connect(p.address, "client:wd")  # takes the other one by plain key
    assert read_reply(client)[0].ok
    wait_for_matches(p, "withdrawing slots")
    wait_for_matches(p, "registered with tracker", 2)
    wait_until(lambda: tracker_free_slots(tracker.address, "wd") == 0)


def test_a_handed_out_key_that_nobody_uses_is_rotated(start_service, proxy):
    tracker = start_tvm_tracker(start_service)
    p = proxy("--tracker", f"{tracker.host}:{tracker.port}")
    device = connect(p.address, "server:rot")
    first = wait_for_matches(p, r"offered (rot:\S+) to the tracker")[0].group(1)
    host, port, matchkey = tracker_request(tracker.address, "rot")
    assert (host, port, matchkey) == ("127.0.0.1", p.port, first)
    wait_for_matches(p, rf"no client came for {re.escape(first)}")
    second = wait_for_matches(p, r"offered (rot:\S+) to the tracker", 2)[1].group(1)
    assert second != first
    late = connect(p.address, f"client:{first}")
    assert read_reply(late)[0].code == hs.RPC_CODE_MISMATCH  # MISMATCH at once: TVM's client re-requests
    assert tracker_request(tracker.address, "rot")[2] == second
    client = connect(p.address, f"client:{second}")
    assert read_reply(client)[0].ok and read_reply(device)[0].ok
