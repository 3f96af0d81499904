"""TLS between device servers, clients and the proxy: a --through-proxy server's link, and
clients through the proxy, with real processes."""
from __future__ import annotations

import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import kernelrpc
from conftest import wait_until
from kernelrpc import rpc
from kernelrpc.rpc.tracker_client import connect_tracker
from servicectl import child_env

DEVICE_READY = re.compile(r"connected to proxy (\S+):(\d+)")


def proxy_has_tls() -> bool:
    out = subprocess.run([sys.executable, "-m", "kernelrpc.proxy", "--help"], capture_output=True, text=True,
                         timeout=60, env=child_env())
    return "--tls-cert" in out.stdout


needs_tls_proxy = pytest.mark.skipif(not proxy_has_tls(), reason="this proxy has no --tls-cert")


def start_device(start_service, proxy, tls_files, *extra):
    return start_service("kernelrpc.server", ["--through-proxy", "--host", proxy.host, "--port", str(proxy.port),
                                              "--key", "dev", "--tls-ca", tls_files.ca, *extra],
                         ready=DEVICE_READY)


def test_tls_device_to_a_plain_proxy_says_it_does_not_speak_tls(start_service, tls_files):
    proxy = start_service("kernelrpc.proxy", ["--port", "0"])
    device = start_service("kernelrpc.server", ["--through-proxy", "--host", proxy.host, "--port", str(proxy.port),
                                                "--key", "dev", "--tls-ca", tls_files.ca],
                           ready=re.compile(r"does not speak TLS"))
    assert device.proc.poll() is None       # it goes on retrying, with backoff


@needs_tls_proxy
def test_device_and_client_through_a_tls_proxy(start_service, tls_files, fixture_module):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", *tls_files.flags()])
    start_device(start_service, proxy, tls_files)
    with rpc.connect(proxy.host, proxy.port, key="dev", tls=tls_files.client()) as sess:
        assert sess.get_function("testing.echo")("through TLS") == "through TLS"
        data = np.random.default_rng(2).standard_normal(1 << 18).astype("float32")
        assert np.array_equal(sess.array(data).numpy(), data)
        sess.upload(fixture_module, "kernels.so")
        module = sess.load_module("kernels.so")
        with pytest.raises(kernelrpc.ServerCrashed) as info:
            module["crash_segv"]()
        assert info.value.signal == signal.SIGSEGV
    with rpc.connect(proxy.host, proxy.port, key="dev", tls=tls_files.client()) as sess:   # it reconnected
        assert sess.get_function("testing.echo")(2) == 2


@needs_tls_proxy
def test_session_timeout_through_a_tls_proxy(start_service, tls_files):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", *tls_files.flags()])
    start_device(start_service, proxy, tls_files)
    with rpc.connect(proxy.host, proxy.port, key="dev", session_timeout=1, tls=tls_files.client()) as sess:
        with pytest.raises(kernelrpc.SessionTimeout):
            sess.get_function("testing.sleep")(30)


@needs_tls_proxy
def test_plain_device_to_a_tls_proxy_is_refused(start_service, tls_files):
    proxy = start_service("kernelrpc.proxy", ["--port", "0", *tls_files.flags()])
    start_service("kernelrpc.server", ["--through-proxy", "--host", proxy.host, "--port", str(proxy.port),
                                       "--key", "dev"], ready=re.compile(r"TLS peers only|requires TLS"))


@needs_tls_proxy
def test_tracker_hands_out_a_tls_proxy_and_the_client_reaches_the_device(start_service, tls_files):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", *tls_files.flags()])
    proxy = start_service("kernelrpc.proxy", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                              *tls_files.flags()])
    start_device(start_service, proxy, tls_files)

    def free():
        with connect_tracker(*tracker.address, tls=tls_files.client()) as session:
            return session.summary()["queue_info"].get("dev", {}).get("free", 0)

    wait_until(free, what="the device offered at the tracker through the proxy")
    with connect_tracker(*tracker.address, tls=tls_files.client()) as session:
        with session.request("dev", timeout=20) as sess:
            assert sess.get_function("testing.echo")("tracker, proxy, device") == "tracker, proxy, device"
