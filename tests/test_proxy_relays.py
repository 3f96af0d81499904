"""Every relay the proxy runs keeps the one SessionRelay contract (kernelrpc.proxy.relay)."""
from __future__ import annotations

import asyncio
import importlib.util
import os
import platform
import socket
import sys
import threading
from types import SimpleNamespace

import pytest

from kernelrpc.proxy import relays
from kernelrpc.proxy.relay import SessionRelay
from kernelrpc.proxy.tls import TLSLayer
from kernelrpc.wire.tls import TLSConfig
from proxy_peers import recv_exactly

NATIVE = (sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")
          and importlib.util.find_spec("llvmlite") is not None)
MODES = [pytest.param("native", marks=pytest.mark.skipif(not NATIVE, reason="no native relay here")),
         "splice", "copy", "copy (TLS)"]


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    runner.join(10)
    loop.close()


def on_loop(loop, function, *args):
    async def call():
        return function(*args)
    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def tls_handshake(outer: socket.socket, inner: socket.socket, tls_files):
    """(client side, the proxy's TLSLayer) after a TLS handshake over the socket pair."""
    result = {}

    def client():
        context = tls_files.client().client_context()
        result["sock"] = context.wrap_socket(outer, server_hostname="127.0.0.1")
    peer = threading.Thread(target=client)
    peer.start()
    layer = TLSLayer(TLSConfig(certfile=tls_files.cert).server_context())
    while not layer.handshake_done:
        layer.receive(inner.recv(65536))
        inner.sendall(layer.take())
    peer.join(10)
    inner.setblocking(False)
    return result["sock"], layer


def open_pair(loop, mode: str, tls_files):
    """(outer_a, outer_b, relay, closed): the relay joins inner_a and inner_b."""
    outer_a, inner_a = socket.socketpair()
    outer_b, inner_b = socket.socketpair()
    layers = (None, None)
    if mode == "copy (TLS)":
        (outer_a, layer_a), (outer_b, layer_b) = (tls_handshake(o, i, tls_files) for o, i in
                                                  ((outer_a, inner_a), (outer_b, inner_b)))
        layers = (layer_a, layer_b)
    closed = threading.Event()
    a, b = (SimpleNamespace(sock=s, decoder=None, tls=t) for s, t in zip((inner_a, inner_b), layers))
    relay = on_loop(loop, lambda: relays.open_relay(mode, loop, a, b, to_a=b"to a", to_b=b"to b",
                                                     on_close=closed.set))
    on_loop(loop, relay.start)
    return outer_a, outer_b, relay, closed, (inner_a, inner_b)


def wait_closed(loop, relay) -> None:
    asyncio.run_coroutine_threadsafe(relay.wait_closed(), loop).result(10)


@pytest.mark.parametrize("mode", MODES)
def test_a_relay_moves_bytes_both_ways_counts_them_and_ends_with_either_side(loop, mode, tls_files):
    a, b, relay, closed, inner = open_pair(loop, mode, tls_files)
    assert isinstance(relay, SessionRelay) and relay.kind == mode
    assert recv_exactly(a, 4) == b"to a" and recv_exactly(b, 4) == b"to b"
    payload = os.urandom(2 << 20)
    sender = threading.Thread(target=a.sendall, args=(payload,))
    sender.start()
    assert recv_exactly(b, len(payload)) == payload
    sender.join()
    b.sendall(b"pong")
    assert recv_exactly(a, 4) == b"pong"
    b.close()                                   # either side ends: the other is closed too
    assert a.recv(1) == b""
    assert closed.wait(10)
    wait_closed(loop, relay)
    if mode == "copy (TLS)":                  # raw bytes read: records, larger than the payload
        assert relay.bytes_moved[0] > len(payload) and relay.bytes_moved[1] > 4
    else:
        assert relay.bytes_moved == (len(payload), 4)
    assert all(s.fileno() == -1 for s in inner)
    a.close()


@pytest.mark.parametrize("mode", MODES)
def test_close_ends_a_busy_relay_and_wait_closed_returns_after_the_sockets_closed(loop, mode, tls_files):
    a, b, relay, closed, inner = open_pair(loop, mode, tls_files)
    recv_exactly(a, 4)
    recv_exactly(b, 4)
    a.sendall(b"x")
    assert recv_exactly(b, 1) == b"x"
    on_loop(loop, relay.close)
    on_loop(loop, relay.close)                  # twice is harmless
    wait_closed(loop, relay)
    assert closed.is_set() and all(s.fileno() == -1 for s in inner)
    assert a.recv(1) == b"" and b.recv(1) == b""
    a.close()
    b.close()


def test_tls_refuses_the_relays_that_move_raw_bytes():
    for mode in ("native", "splice"):
        with pytest.raises(relays.RelayUnavailable, match="cannot re-encrypt TLS"):
            relays.choose_relay(mode, tls=True)
    assert relays.choose_relay("auto", tls=True) == relays.choose_relay("copy", tls=True) == "copy (TLS)"


@pytest.mark.parametrize("chunk", [777, 16 * 1024 + 5, 300_000, 4 << 20])
def test_the_tls_layer_returns_every_byte_however_records_are_cut(tls_files, chunk):
    """Sans-IO: a TLS client over memory BIOs, its records fed to the proxy's layer in pieces."""
    import ssl

    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = tls_files.client().client_context().wrap_bio(to_client, to_server, server_hostname="127.0.0.1")
    layer = TLSLayer(TLSConfig(certfile=tls_files.cert).server_context())
    while not layer.handshake_done:
        try:
            client.do_handshake()
        except ssl.SSLWantReadError:
            pass
        layer.receive(to_server.read())
        to_client.write(layer.take())
    client.do_handshake()
    payload = os.urandom(1 << 20)
    client.write(payload)
    records = to_server.read()
    got = bytearray()
    for i in range(0, len(records), chunk):
        got += layer.receive(records[i:i + chunk])
    assert bytes(got) == payload
    layer.send(b"answer")
    to_client.write(layer.take())
    assert client.read(100) == b"answer"
