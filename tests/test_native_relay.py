"""The JIT-compiled relay loop on socket pairs, without a proxy around it."""
from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import platform
import re
import select
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from kernelrpc.proxy import native_relay
from proxy_peers import recv_exactly

#: Where the relay must run: decided here, not by the code under test, so that a
#: broken relay fails these tests instead of skipping them.
SUPPORTED = (sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
             and any(shutil.which(cc) for cc in ("cc", "gcc", "clang")))
if not SUPPORTED:  # pragma: no cover - other platforms
    pytest.skip(f"no native relay on {sys.platform}/{platform.machine()}", allow_module_level=True)
STOPPED = 1  # kernelrpc_relay's return value when told to stop (native_loop.STOPPED)


C_TYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "char *": ctypes.c_void_p,
           "int32_t *": ctypes.c_void_p, "int64_t *": ctypes.c_void_p}


def test_the_relay_compiles_here_and_its_abi_is_the_c_signature():
    from kernelrpc.proxy import native_loop

    function = native_relay.relay_function()  # raises, never skips, on a supported platform
    assert function.function.argtypes == tuple(p.c_type for p in native_loop.PARAMS)
    source = native_loop.SOURCE.read_text()
    assert f"#define STOPPED {STOPPED} " in source and native_loop.STOPPED == STOPPED
    signature = re.search(r"int64_t kernelrpc_relay\(([^)]*)\)", source).group(1)
    params = [re.match(r"(.*?)\s*(\w+)$", p.strip()).groups() for p in signature.split(",")]
    assert [name for _, name in params] == [p.name for p in native_loop.PARAMS]
    assert [C_TYPES[kind] for kind, _ in params] == [p.c_type for p in native_loop.PARAMS]
    with pytest.raises(TypeError, match="takes"):
        native_loop.arguments(a=1, b=2)


def test_starting_a_proxy_with_the_native_relay_loads_neither_compiler_nor_numpy():
    script = (
        "import asyncio, sys\n"
        "from kernelrpc.proxy.service import ProxyConfig, ProxyService\n"
        "async def main():\n"
        "    service = ProxyService(ProxyConfig(port=0, relay='native'))\n"
        "    await service.start()\n"
        "    print(service.relay_mode)\n"
        "    await service.close()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('kernelrpc.compiler')))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")
    assert out[:2] == ["native", "[]"], out


def relay_between(spin_ns: int = 0, to_a: bytes = b"", to_b: bytes = b""):
    """(outer_a, outer_b, relay, loop thread): bytes written to outer_a come out of outer_b."""
    outer_a, inner_a = socket.socketpair()
    outer_b, inner_b = socket.socketpair()
    loop = asyncio.new_event_loop()
    closed = threading.Event()
    relay = native_relay.NativeRelay(loop, inner_a, inner_b, to_a=to_a, to_b=to_b,
                                     spin_ns=spin_ns, on_close=closed.set)
    relay.start()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    return outer_a, outer_b, relay, loop, closed


def stop(loop) -> None:
    loop.call_soon_threadsafe(loop.stop)


@pytest.mark.parametrize("spin_ns", [0, 50_000])
def test_bytes_cross_both_ways_after_the_queued_replies(spin_ns):
    a, b, relay, loop, closed = relay_between(spin_ns, to_a=b"hello a", to_b=b"hello b")
    try:
        assert recv_exactly(a, 7) == b"hello a"
        assert recv_exactly(b, 7) == b"hello b"
        payload = os.urandom(3 << 20)
        sender = threading.Thread(target=a.sendall, args=(payload,))
        sender.start()
        assert recv_exactly(b, len(payload)) == payload
        sender.join()
        for i in range(200):  # ping-pong, as an RPC session does
            b.sendall(i.to_bytes(4, "little"))
            assert recv_exactly(a, 4) == i.to_bytes(4, "little")
        a.close()  # one side ends: the other is closed once the relay has delivered everything
        assert b.recv(1) == b""
        assert closed.wait(10)
        rc, from_a, from_b = relay.result
        assert rc == 0 and from_a == len(payload) and from_b == 800
    finally:
        stop(loop)


def test_everything_sent_before_a_close_is_delivered():
    a, b, _, loop, closed = relay_between()
    try:
        payload = os.urandom(8 << 20)
        sender = threading.Thread(target=lambda: (a.sendall(payload), a.close()))
        sender.start()
        assert recv_exactly(b, len(payload)) == payload
        assert b.recv(1) == b""
        sender.join()
        assert closed.wait(10)
    finally:
        stop(loop)


def test_close_stops_the_loop_and_closes_both_sockets():
    a, b, relay, loop, closed = relay_between(spin_ns=1_000_000)
    try:
        a.sendall(b"x")
        assert recv_exactly(b, 1) == b"x"
        loop.call_soon_threadsafe(relay.close)
        assert closed.wait(10)
        assert relay.result[0] == STOPPED
        assert a.recv(1) == b"" and b.recv(1) == b""
    finally:
        stop(loop)


def test_close_stops_a_loop_that_never_goes_quiet():
    a, b, relay, loop, closed = relay_between(spin_ns=10_000_000_000)
    talking = threading.Event()

    def ping_pong():
        try:
            while True:
                a.sendall(b"ping")
                recv_exactly(a, 4)
                talking.set()
        except OSError:
            pass

    def echo():
        try:
            while True:
                b.sendall(recv_exactly(b, 4))
        except OSError:
            pass

    threads = [threading.Thread(target=f, daemon=True) for f in (ping_pong, echo)]
    for t in threads:
        t.start()
    try:
        assert talking.wait(10)
        loop.call_soon_threadsafe(relay.close)
        assert closed.wait(10), "the relay went on while messages kept flowing"
        assert relay.result[0] == STOPPED
    finally:
        stop(loop)
        a.close()
        b.close()


def test_a_reset_ends_the_relay_with_the_error():
    a, b, relay, loop, closed = relay_between()
    try:
        b.sendall(b"data that a never reads")
        assert select.select([a], [], [], 10)[0]
        a.close()  # with unread data: the relay's side gets ECONNRESET, not EOF
        assert closed.wait(10)
        assert relay.result[0] == -errno.ECONNRESET
        assert b.recv(1) == b""
    finally:
        stop(loop)


def test_a_broken_relay_is_an_error_even_for_auto(monkeypatch, tmp_path):
    """Only "not supported here" (no C compiler) may fall back; a source the compiler rejects
    must fail loudly."""
    from kernelrpc.proxy import native_loop, relays

    broken = tmp_path / "native_relay.c"
    broken.write_text(native_loop.SOURCE.read_text().replace("return rc;", "return rc"))
    monkeypatch.setattr(native_loop.compile_relay, "__defaults__", (broken,))
    monkeypatch.setenv("KERNELRPC_CACHE_DIR", str(tmp_path / "cache"))
    native_relay.relay_function.cache_clear()
    try:
        for requested in ("auto", "native"):
            with pytest.raises(RuntimeError, match="native_relay.c") as info:
                relays.choose_relay(requested)
            assert not isinstance(info.value, native_relay.NativeRelayUnavailable), info.value
    finally:
        native_relay.relay_function.cache_clear()


def test_no_c_compiler_falls_back(monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    native_relay.relay_function.cache_clear()
    try:
        with pytest.raises(native_relay.NativeRelayUnavailable, match="C compiler"):
            native_relay.relay_function()
    finally:
        native_relay.relay_function.cache_clear()
