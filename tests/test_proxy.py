"""The proxy service with raw handshake peers (real sockets, ``python -m kernelrpc.proxy``)."""
from __future__ import annotations

import os
import platform
import select
import socket
import struct
import subprocess
import sys
import threading

import pytest

from conftest import wait_until
from kernelrpc.wire import handshake as hs
from proxy_peers import connect, is_closed, offered_matchkey, read_reply, recv_exactly, wait_for_matches


def pair(address, key="k", client_key=None):
    """A device waiting with ``server:key``, then a client; returns both paired sockets."""
    device = connect(address, f"server:{key}")
    client = connect(address, client_key or f"client:{key} -timeout=30")
    reply, extra = read_reply(client)
    assert reply.ok and reply.key == f"server:{key}" and not extra
    dreply, extra = read_reply(device)
    assert dreply.ok and dreply.key == (client_key or f"client:{key} -timeout=30") and not extra
    return device, client


def check_relay(a: socket.socket, b: socket.socket, nbytes: int = 1 << 20) -> None:
    payload = os.urandom(nbytes)
    sender = threading.Thread(target=a.sendall, args=(payload,))
    sender.start()
    assert recv_exactly(b, nbytes) == payload
    sender.join()
    b.sendall(b"pong")
    assert recv_exactly(a, 4) == b"pong"


def relaying_proxy(proxy, relay: str, *args: str):
    """A proxy started with ``--relay relay``; its log proves that relay is the one running."""
    p = proxy("--relay", relay, *args)
    wait_for_matches(p, rf"relaying with {relay} \(")
    return p


def _without_a_c_compiler(tmp_path) -> dict:
    """Environment for a child that finds no C compiler (``$CC`` names a missing one), as on a
    host without one."""
    from kernelrpc.deploy.launch import SRC
    return {"PYTHONPATH": SRC, "CC": str(tmp_path / "no-such-cc")}


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")),
                    reason="the native relay runs on 64-bit Linux")
def test_the_default_relay_is_native_here(proxy):
    p = proxy()
    wait_for_matches(p, r"relaying with native \(")


def test_without_a_c_compiler_auto_falls_back_with_a_warning(start_service, tmp_path):
    p = start_service("kernelrpc.proxy", ["--port", "0"], env=_without_a_c_compiler(tmp_path))
    wait_for_matches(p, r"WARNING.*the native relay needs a C compiler.*relaying with splice instead")
    wait_for_matches(p, r"relaying with splice \(")
    device, client = pair(p.address)
    check_relay(client, device, 4096)


def test_without_a_c_compiler_an_explicit_native_relay_fails_start_up(tmp_path):
    from kernelrpc.deploy.launch import child_env
    done = subprocess.run([sys.executable, "-m", "kernelrpc.proxy", "--port", "0", "--relay",
                           "native"], env=child_env(_without_a_c_compiler(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "--relay native: the native relay needs a C compiler" in done.stderr
    assert "listening" not in done.stdout


def test_ready_line_and_port_range(start_service):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    taken = probe.getsockname()[1]
    probe.listen()
    try:
        svc = start_service("kernelrpc.proxy", ["--port", str(taken), "--port-end", str(taken + 50)])
        assert svc.lines[0] == f"kernelrpc.proxy listening on 127.0.0.1:{svc.port}"
        assert taken < svc.port < taken + 50
    finally:
        probe.close()


@pytest.mark.parametrize("relay", ["native", "splice", "copy"])
def test_device_first_then_client_relays_both_ways_and_closes_together(proxy, relay):
    p = relaying_proxy(proxy, relay)
    device, client = pair(p.address)
    check_relay(client, device)
    check_relay(device, client)
    client.close()
    assert is_closed(device)
    wait_for_matches(p, "paired client")


@pytest.mark.parametrize("relay", ["native", "splice", "copy"])
def test_everything_a_side_sent_before_closing_is_delivered(proxy, relay):
    device, client = pair(relaying_proxy(proxy, relay).address)
    payload = os.urandom(8 << 20)
    sender = threading.Thread(target=lambda: (client.sendall(payload), client.close()))
    sender.start()
    assert recv_exactly(device, len(payload)) == payload
    assert is_closed(device)
    sender.join()


@pytest.mark.parametrize("relay", ["native", "splice"])
def test_stopping_the_proxy_closes_active_sessions(proxy, relay):
    p = relaying_proxy(proxy, relay, "--relay-spin-us", "1000000")
    device, client = pair(p.address)
    check_relay(client, device, 4096)  # the native loop now polls for a second
    assert p.stop() == 0
    assert is_closed(device) and is_closed(client)


def test_client_first_then_device(proxy):
    p = proxy()
    client = connect(p.address, "client:late -timeout=5")
    wait_for_matches(p, r"client \S+ waits for key 'late'")
    device = connect(p.address, "server:late")
    assert read_reply(device)[0].key == "client:late -timeout=5"
    assert read_reply(client)[0].key == "server:late"
    check_relay(device, client, 4096)
    device.close()
    assert is_closed(client)


def test_lonely_client_gets_mismatch_after_its_timeout(proxy):
    p = proxy("--timeout-client", "1")
    client = connect(p.address, "client:nobody")
    reply, _ = read_reply(client)
    assert reply.code == hs.RPC_CODE_MISMATCH
    with pytest.raises(Exception, match="MISMATCH"):
        reply.raise_for_code("proxy")
    assert is_closed(client)


def test_lonely_device_gets_mismatch_after_its_timeout(proxy):
    p = proxy("--timeout-server", "1")
    device = connect(p.address, "server:idle")
    assert read_reply(device)[0].code == hs.RPC_CODE_MISMATCH
    assert is_closed(device)


def test_device_that_disconnects_while_waiting_is_dropped(proxy):
    p = proxy("--timeout-client", "1")
    gone = connect(p.address, "server:flaky")
    offered_matchkey(p, "flaky")
    gone.close()
    wait_for_matches(p, r"device \S+ left while waiting for key 'flaky'")
    client = connect(p.address, "client:flaky")
    assert read_reply(client)[0].code == hs.RPC_CODE_MISMATCH
    device, client = pair(p.address, "flaky")  # a new device with the key is served
    check_relay(client, device, 1000)


def test_two_devices_with_the_same_key_are_both_usable(proxy):
    p = proxy()
    devices = [connect(p.address, "server:twin") for _ in range(2)]
    offered_matchkey(p, "twin", 2)
    clients = [connect(p.address, "client:twin") for _ in range(2)]
    for sock in clients + devices:
        assert read_reply(sock)[0].ok
    for i, client in enumerate(clients):
        client.sendall(struct.pack("<i", i))
    received = sorted(struct.unpack("<i", recv_exactly(d, 4))[0] for d in devices)
    assert received == [0, 1]


def _proc_status(pid: int, field: str) -> int:
    """A number from /proc/PID/status (``Threads``; ``VmRSS`` in KiB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def test_many_concurrent_sessions_each_get_their_own_bytes_and_leave_no_threads(proxy):
    p = proxy()
    baseline = _proc_status(p.proc.pid, "Threads")
    pairs = [pair(p.address, f"many{i}") for i in range(40)]
    for i, (device, client) in enumerate(pairs):
        client.sendall(struct.pack("<i", i) * 1000)
    for i, (device, client) in enumerate(pairs):
        assert recv_exactly(device, 4000) == struct.pack("<i", i) * 1000
        device.sendall(struct.pack("<i", -i))
        assert recv_exactly(client, 4) == struct.pack("<i", -i)
    for device, client in pairs:
        client.close()
        assert is_closed(device)
    wait_until(lambda: _proc_status(p.proc.pid, "Threads") <= baseline, timeout=10,
               what=f"the proxy back to its {baseline} threads")


def test_exact_matchkey_picks_that_device_and_a_gone_key_is_refused_at_once(proxy):
    p = proxy("--timeout-client", "30")
    first = connect(p.address, "server:pick")
    second = connect(p.address, "server:pick")
    second_key = offered_matchkey(p, "pick", 2)
    client = connect(p.address, f"client:{second_key} -timeout=9")
    assert read_reply(client)[0].ok
    assert read_reply(second)[0].key == f"client:{second_key} -timeout=9"
    late = connect(p.address, f"client:{second_key}")
    assert read_reply(late)[0].code == hs.RPC_CODE_MISMATCH  # long before the 30 s timeout
    client2 = connect(p.address, "client:pick")
    assert read_reply(client2)[0].ok and read_reply(first)[0].ok


BAD_INPUTS = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "tracker magic": struct.pack("<i", hs.RPC_TRACKER_MAGIC) + b"\x00" * 8,
    "negative length": struct.pack("<ii", hs.RPC_MAGIC, -1),
    "huge length": struct.pack("<ii", hs.RPC_MAGIC, 1 << 30),
    "not utf-8": struct.pack("<ii", hs.RPC_MAGIC, 4) + b"\xff\xfe\xfd\xfc",
    "data before pairing": hs.encode_preamble("server:eager") + b"\x01\x02",
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_is_closed_and_the_proxy_goes_on(proxy, name):
    p = proxy()
    bad = socket.create_connection(p.address, timeout=10)
    bad.sendall(BAD_INPUTS[name])
    assert is_closed(bad)
    device, client = pair(p.address, "after-" + name.replace(" ", "-"))
    check_relay(client, device, 1000)


@pytest.mark.parametrize("key", ["nokind", "server:", "client:", "client:a\x00b"])
def test_malformed_keys_get_mismatch(proxy, key):
    p = proxy()
    sock = connect(p.address, key)
    assert read_reply(sock)[0].code == hs.RPC_CODE_MISMATCH
    assert is_closed(sock)


def test_silent_and_half_sent_peers_are_closed_without_stalling_others(proxy):
    p = proxy("--timeout-handshake", "1")
    silent = socket.create_connection(p.address, timeout=10)
    half = socket.create_connection(p.address, timeout=10)
    half.sendall(hs.encode_preamble("client:half")[:9])
    device, client = pair(p.address, "busy")  # served while the two above hang
    check_relay(client, device, 1000)
    assert is_closed(silent) and is_closed(half)


@pytest.mark.parametrize("relay", ["native", "splice", "copy"])
def test_slow_reader_applies_backpressure_without_memory_growth(proxy, relay):
    p = relaying_proxy(proxy, relay)
    device, client = pair(p.address, "slow")
    rss_before = _proc_status(p.proc.pid, "VmRSS")
    client.setblocking(False)
    pattern = memoryview(bytes(range(256)) * 8192)  # 2 MiB; byte i of the stream is i % 256
    sent = 0
    while sent < 256 << 20:  # the device does not read meanwhile
        if not select.select([], [client], [], 1.0)[1]:
            break  # blocked for a second: the proxy stopped reading
        try:
            sent += client.send(pattern[sent % 256:sent % 256 + (1 << 20)])
        except BlockingIOError:
            pass
    growth_mib = (_proc_status(p.proc.pid, "VmRSS") - rss_before) / 1024
    print(f"sent {sent / 2**20:.1f} MiB before blocking; proxy RSS grew {growth_mib:.1f} MiB")
    assert sent < 128 << 20, "the proxy kept reading from the client although the device did not"
    assert growth_mib < 32
    client.setblocking(True)
    received = recv_exactly(device, sent)
    assert received == (bytes(range(256)) * (sent // 256 + 1))[:sent]
