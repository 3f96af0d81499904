"""A topology where the device really cannot be reached: three network namespaces.

    client ns --veth-- proxy ns --veth-- device ns
    10.77.1.2          10.77.1.1 | 10.77.2.1          10.77.2.2

The proxy namespace does not forward packets, so the client has no route to the
device; both can reach only the proxy.  Needs root (CAP_NET_ADMIN) and ``ip``.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import uuid

import pytest

from proxy_peers import wait_for_matches
from servicectl import SRC, child_env

pytestmark = pytest.mark.netns

PAIRED = r"""
import os, socket, sys
from kernelrpc.wire import handshake as hs
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
sock.sendall(hs.encode_preamble("ROLE:nsdev"))
print("raw ROLE connected", flush=True)
parser, reply = hs.ReplyParser(), None
while reply is None:
    chunk = sock.recv(4096)
    if not chunk:
        sys.exit("the proxy closed before its reply")
    reply = parser.feed(chunk)
reply.raise_for_code("proxy")
"""
"""A raw peer paired by the proxy under key ``nsdev`` (ROLE: server or client)."""

ECHO_DEVICE = PAIRED.replace("ROLE", "server") + r"""
data = parser.unused
while True:
    if data:
        sock.sendall(data[::-1])
    data = sock.recv(65536)
    if not data:
        break
"""

ECHO_CLIENT = PAIRED.replace("ROLE", "client") + r"""
msg = os.urandom(1000)
sock.sendall(msg)
got = parser.unused
while len(got) < len(msg):
    chunk = sock.recv(65536)
    if not chunk:
        sys.exit(f"closed after {len(got)} of {len(msg)} bytes")
    got += chunk
assert got == msg[::-1]
print("echo through the proxy ok", reply.key)
"""

SESSION_CLIENT = r"""
import sys
import numpy as np
from kernelrpc import nd, rpc
with rpc.connect(sys.argv[1], int(sys.argv[2]), key="nsours", session_timeout=60) as sess:
    x = np.arange(1 << 16, dtype="float32")
    assert (nd.array(x, sess.cpu(0)).numpy() == x).all()
    print("session through the proxy ok", sess.get_function("testing.echo")("hi"))
"""

LISTENER = r"""
import socket
srv = socket.create_server(("0.0.0.0", 0))
print(f"direct listener listening on 0.0.0.0:{srv.getsockname()[1]}", flush=True)
while True:
    srv.accept()[0].close()
"""

CONNECT_PROBE = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("reachable")
except OSError as exc:
    print("unreachable:", exc)
"""


# No port group: the test process cannot see another namespace's listening sockets.
NS_READY = re.compile(r"listening on (\S+)")


def port_of(service) -> int:
    return int(service.match.group(1).rsplit(":", 1)[1])


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


class Topology:
    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.ns = {role: f"krpc-{role}-{tag}" for role in ("client", "proxy", "device")}
        self.created: list[str] = []
        self.wrappers: dict[str, str] = {}

    def build(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        for name in self.ns.values():
            result = _ip("netns", "add", name)
            if result.returncode != 0:
                pytest.skip(f"network namespaces cannot be created here: {result.stderr.strip()}")
            self.created.append(name)
        c, p, d = self.ns["client"], self.ns["proxy"], self.ns["device"]
        steps = [
            ("link", "add", "vc", "netns", c, "type", "veth", "peer", "name", "vpc", "netns", p),
            ("link", "add", "vd", "netns", d, "type", "veth", "peer", "name", "vpd", "netns", p),
            ("-n", c, "addr", "add", "10.77.1.2/24", "dev", "vc"),
            ("-n", p, "addr", "add", "10.77.1.1/24", "dev", "vpc"),
            ("-n", p, "addr", "add", "10.77.2.1/24", "dev", "vpd"),
            ("-n", d, "addr", "add", "10.77.2.2/24", "dev", "vd"),
        ] + [("-n", ns, "link", "set", dev, "up") for ns, dev in
             ((c, "lo"), (c, "vc"), (p, "lo"), (p, "vpc"), (p, "vpd"), (d, "lo"), (d, "vd"))]
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(f"cannot build the veth topology (ip {' '.join(step)}): "
                            f"{result.stderr.strip()}")
        subprocess.run(["ip", "netns", "exec", p, "sysctl", "-qw", "net.ipv4.ip_forward=0"],
                       check=True, timeout=30)
        for role, name in self.ns.items():
            path = tmp_path / f"python-in-{role}"
            path.write_text(f'#!/bin/sh\nexec ip netns exec {name} {sys.executable} "$@"\n')
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
            self.wrappers[role] = str(path)

    def start_snippet(self, start_service, role: str, name: str, code: str, *args: str,
                      ready: str | None = None):
        """Run ``code`` as module ``name`` inside a namespace, as a service with a ready line."""
        (self.tmp_path / f"{name}.py").write_text(code)
        kwargs = {"ready": re.compile(ready) if ready else NS_READY}
        return start_service(name, list(args), python=self.wrappers[role],
                             env={"PYTHONPATH": f"{SRC}{os.pathsep}{self.tmp_path}"}, **kwargs)

    def run_python(self, role: str, code: str, *args: str, timeout: float = 60) -> str:
        out = subprocess.run([self.wrappers[role], "-c", code, *args], env=child_env(),
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def destroy(self) -> None:
        for name in self.created:
            _ip("netns", "del", name)


@pytest.fixture
def topology(tmp_path):
    if shutil.which("ip") is None:
        pytest.skip("the `ip` tool (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CAP_NET_ADMIN)")
    topo = Topology()
    try:
        topo.build(tmp_path)
        yield topo
    finally:
        topo.destroy()


def test_device_unreachable_from_client_but_a_session_through_the_proxy_works(topology,
                                                                              start_service):
    listener = topology.start_snippet(start_service, "device", "ns_listener", LISTENER)
    assert topology.run_python("proxy", CONNECT_PROBE, "10.77.2.2", str(port_of(listener))) \
        .startswith("reachable")
    probe = topology.run_python("client", CONNECT_PROBE, "10.77.2.2", str(port_of(listener)))
    assert probe.startswith("unreachable"), probe
    print(probe.strip())

    proxy = start_service("kernelrpc.proxy", ["--host", "0.0.0.0", "--port", "0"],
                          python=topology.wrappers["proxy"], ready=NS_READY)
    proxy_port = str(port_of(proxy))
    topology.start_snippet(start_service, "device", "ns_echo_device", ECHO_DEVICE,
                           "10.77.2.1", proxy_port, ready="raw server connected")
    wait_for_matches(proxy, r"device 10\.77\.2\.2:\d+ waits for key 'nsdev'")
    out = topology.run_python("client", ECHO_CLIENT, "10.77.1.1", proxy_port)
    assert "echo through the proxy ok server:nsdev" in out
    wait_for_matches(proxy, r"paired client 10\.77\.1\.2:\d+ .* with device 10\.77\.2\.2:\d+")

    start_service("kernelrpc.server", ["--through-proxy", "--host", "10.77.2.1", "--port",
                                       proxy_port, "--key", "nsours"],
                  python=topology.wrappers["device"], ready=re.compile(r"connected to proxy"))
    wait_for_matches(proxy, r"device 10\.77\.2\.2:\d+ waits for key 'nsours'")
    out = topology.run_python("client", SESSION_CLIENT, "10.77.1.1", proxy_port)
    assert "session through the proxy ok hi" in out
