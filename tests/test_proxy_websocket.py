"""The proxy's WebSocket endpoint (``--web-port``): browser-style devices paired with TCP clients."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading

import pytest
from proxy_peers import connect, is_closed, read_reply, recv_exactly
from servicectl import child_env

from kernelrpc.proxy import websocket as ws
from kernelrpc.wire import handshake as hs

WEB = re.compile(r"\(websocket (ws://(\S+):(\d+)/ws)\)")


def web_proxy(proxy, *args):
    svc = proxy("--web-port", "0", *args)
    match = WEB.search(svc.lines[0])
    return svc, (match.group(2), int(match.group(3))), match.group(1)


class WebSocketPeer:
    """A minimal RFC 6455 client on a plain socket, as a browser device would be."""

    def __init__(self, address, path="/ws"):
        self.sock = socket.create_connection(address, timeout=15)
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, f"closed during the upgrade: {head!r}"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101 "), head
        self.decoder = ws.FrameDecoder(require_mask=False)
        self.events: list = []

    def send(self, data: bytes, opcode=ws.BINARY) -> None:
        self.sock.sendall(ws.encode_frame(opcode, data, mask=os.urandom(4)))

    def next_event(self):
        while not self.events:
            data = self.sock.recv(1 << 20)
            if not data:
                return None
            self.events += self.decoder.feed(data)
        return self.events.pop(0)

    def read(self, n: int) -> bytes:
        """``n`` bytes of the stream (pongs and other control frames are kept aside)."""
        out, aside = b"", []
        while len(out) < n:
            event = self.next_event()
            assert event is not None, f"closed after {len(out)} of {n} bytes"
            if isinstance(event, ws.Data):
                out += event.payload
            else:
                aside.append(event)
        self.events[:0] = aside
        assert len(out) == n, "read past the expected bytes"
        return out

    def handshake(self, key: str) -> hs.Reply:
        self.send(hs.encode_preamble(key))
        return self.read_reply()

    def read_reply(self) -> hs.Reply:
        """The proxy's pairing reply, from the data messages that carry it."""
        parser, reply = hs.ReplyParser(), None
        while reply is None:
            event = self.next_event()
            assert isinstance(event, ws.Data), event
            reply = parser.feed(event.payload)
        return reply


def test_websocket_device_and_tcp_client_relay_both_ways(proxy):
    p, web, _ = web_proxy(proxy)
    device = WebSocketPeer(web)
    device.send(hs.encode_preamble("server:browser"))
    client = connect(p.address, "client:browser")
    assert read_reply(client)[0].key == "server:browser"
    reply = device.read_reply()
    assert reply.ok and reply.key == "client:browser"

    payload = os.urandom(3 << 20)
    sender = threading.Thread(target=client.sendall, args=(payload,))
    sender.start()
    assert device.read(len(payload)) == payload
    sender.join()
    for i in range(50):
        device.send(i.to_bytes(4, "little"))
        assert recv_exactly(client, 4) == i.to_bytes(4, "little")
    big = os.urandom(2 << 20)
    device.send(big[:1000])  # a whole message, then one in fragments with a ping between them
    device.sock.sendall(ws.encode_frame(ws.BINARY, big[1000:5000], mask=b"abcd", fin=False))
    device.send(b"are you there", opcode=ws.PING)
    device.sock.sendall(ws.encode_frame(ws.CONTINUATION, big[5000:], mask=b"dcba"))
    assert recv_exactly(client, len(big)) == big
    assert device.next_event() == ws.Pong(b"are you there")

    client.close()  # the TCP side leaves: the browser gets a close frame, then EOF
    assert isinstance(device.next_event(), ws.Close)
    assert device.next_event() is None


def test_websocket_close_frame_ends_the_session_for_the_tcp_client(proxy):
    p, web, _ = web_proxy(proxy)
    device = WebSocketPeer(web)
    device.send(hs.encode_preamble("server:leaving"))
    client = connect(p.address, "client:leaving")
    assert read_reply(client)[0].ok
    device.send(b"last words")
    device.send(ws.CLOSE_NORMAL.to_bytes(2, "big"), opcode=ws.CLOSE)
    assert recv_exactly(client, 10) == b"last words"
    assert is_closed(client)


def test_websocket_client_for_a_missing_key_gets_a_framed_mismatch(proxy):
    _, web, _ = web_proxy(proxy, "--timeout-client", "1")
    peer = WebSocketPeer(web)
    assert peer.handshake("client:nobody").code == hs.RPC_CODE_MISMATCH
    assert isinstance(peer.next_event(), ws.Close)


@pytest.mark.parametrize("raw, status", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
    (b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n", b"426"),
    (b"\x00\x01\x02garbage\r\n\r\n", b"400"),
])
def test_bad_requests_on_the_web_port_are_answered_and_the_proxy_goes_on(proxy, raw, status):
    p, web, _ = web_proxy(proxy)
    with socket.create_connection(web, timeout=10) as bad:
        bad.sendall(raw)
        answer = b""
        while chunk := bad.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    device = WebSocketPeer(web)
    device.send(hs.encode_preamble("server:after"))
    client = connect(p.address, "client:after")
    assert read_reply(client)[0].ok


def test_broken_frames_close_the_websocket_peer_with_a_protocol_error(proxy):
    _, web, _ = web_proxy(proxy)
    peer = WebSocketPeer(web)
    peer.sock.sendall(ws.encode_frame(ws.BINARY, b"unmasked"))
    event = peer.next_event()
    assert isinstance(event, ws.Close) and event.code == ws.CLOSE_PROTOCOL_ERROR
    assert peer.next_event() is None


TVM_WS_DEVICE = "import sys\nfrom tvm.rpc import proxy\nproxy.websocket_proxy_server(sys.argv[1], key=sys.argv[2])\n"


@pytest.mark.tvm
def test_tvm_websocket_device_serves_a_tvm_client_through_our_proxy(proxy):
    pytest.importorskip("tvm", reason="apache-tvm is not installed")
    from test_proxy_tvm import run_tvm_session

    p, _, url = web_proxy(proxy)
    device = subprocess.Popen([sys.executable, "-c", TVM_WS_DEVICE, url, "webdev"], env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        from proxy_peers import offered_matchkey
        offered_matchkey(p, "webdev")
        assert "session ok" in run_tvm_session(p.host, p.port, "webdev")
    finally:
        device.kill()
        device.wait(10)
