"""The proxy's WebSocket endpoint: our sans-IO codec vs tornado's WebSocketHandler, in one run.

    PYTHONPATH=src python bench/proxy_websocket.py [--quick]

Both endpoints run in a proxy process of their own, on the proxy's asyncio loop, pairing
through the same matchmaker:

* "codec": the proxy as it is (``--web-port``: ``proxy/websocket.py`` + ``proxy/ws_relay.py``,
  the socket handed to the proxy's Python relay, frames cut and joined on the way);
* "tornado": a prototype (below, :class:`TornadoPeer` / :class:`TornadoRelay`) serving ``/ws``
  with ``tornado.websocket.WebSocketHandler`` on the same loop; the TCP side is read with
  ``add_reader`` + ``recv`` and written with ``send`` / ``loop.sock_sendall``, backpressure through the futures of
  ``write_message`` and a future returned by ``on_message``. Figures and the decision they led
  to (the endpoint stays on the codec): docs/proxy.md.

A WebSocket peer (device, key ``server:wsbench``) pairs with a TCP peer (client) that echoes
(round trip) or sinks / sources (throughput) 64 MiB. Also: the proxy's start-up time (launch to
ready line) and the import cost of the proxy with and without tornado.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc.proxy import websocket as ws
from kernelrpc.wire import handshake as hs

MIB = 1 << 20
KEY = "wsbench"
READY = re.compile(r"listening on (\S+):(\d+) \(websocket ws://(\S+):(\d+)/ws\)")


# -- the tornado prototype (runs in the child: --serve tornado) ----------------
def tornado_service(config):
    """A ProxyService whose /ws endpoint is a tornado WebSocketHandler on the same loop."""
    import tornado.httpserver
    import tornado.netutil
    import tornado.web
    import tornado.websocket

    from kernelrpc.proxy.service import ProxyService
    from kernelrpc.wire.handshake import PreambleParser

    class TornadoPeer:
        """What the service's pairing asks of a connection, for a tornado handler."""

        decoder = None
        sock = None

        def __init__(self, service, handler):
            self._service, self.handler = service, handler
            self.name = f"ws:{handler.request.remote_ip}"
            self.waiter = self.timer = None
            self.closed = self.handed_over = False

        def refuse(self, reply: bytes) -> None:
            with contextlib.suppress(tornado.websocket.WebSocketClosedError):
                self.handler.write_message(reply, binary=True)
            self.close()

        def fail(self, reason: str) -> None:
            self.close(1002, reason)

        def close(self, code=1000, reason="") -> None:
            if self.closed or self.handed_over:
                return
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            self.handler.close(code, reason[:120])
            self._service.connection_closed(self)

        def hand_over(self):
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.handed_over = True

    class TornadoRelay:
        def __init__(self, loop, peer, sock, to_ws, to_tcp, on_close):
            self._loop, self._peer, self._sock = loop, peer, sock
            self._to_ws, self._to_tcp, self._on_close = to_ws, to_tcp, on_close
            self._task = None
            self._done = asyncio.Event()

        def start(self):
            self._peer.handler.relay = self
            self._task = self._loop.create_task(self._begin())

        async def _begin(self):
            try:
                await self._peer.handler.write_message(self._to_ws, binary=True)
                await self._loop.sock_sendall(self._sock, self._to_tcp)
            except (OSError, tornado.websocket.WebSocketClosedError):
                self.close()
                return
            self._loop.add_reader(self._sock.fileno(), self._readable)

        def _readable(self):
            try:
                data = self._sock.recv(MIB)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            try:
                written = self._peer.handler.write_message(data, binary=True)
            except tornado.websocket.WebSocketClosedError:
                self.close()
                return
            if not written.done():  # backpressure: stop reading until tornado flushed it
                self._loop.remove_reader(self._sock.fileno())
                written.add_done_callback(self._resume)

        def _resume(self, _):
            if not self._done.is_set():
                self._loop.add_reader(self._sock.fileno(), self._readable)

        def from_ws(self, message: bytes):
            """None when the TCP peer took it all, else a future tornado waits for."""
            try:
                sent = self._sock.send(message)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.close()
                return None
            if sent == len(message):
                return None
            return self._loop.create_task(self._send_rest(memoryview(message)[sent:]))

        async def _send_rest(self, rest):
            try:
                await self._loop.sock_sendall(self._sock, rest)
            except OSError:
                self.close()

        def close(self):
            if self._done.is_set():
                return
            self._done.set()
            if self._task is not None and self._task is not asyncio.current_task():
                self._task.cancel()
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._sock.fileno())
            self._peer.handler.close()
            self._sock.close()
            self._on_close()

        async def wait_closed(self):
            await self._done.wait()

    class Handler(tornado.websocket.WebSocketHandler):
        def initialize(self, service):
            self.service = service
            self.relay = None
            self.parser = PreambleParser()

        def check_origin(self, origin):
            return True

        def open(self):
            self.peer = TornadoPeer(self.service, self)
            self.service.connections.add(self.peer)
            self.peer.timer = self.service._loop.call_later(
                self.service.config.handshake_timeout, self.service._handshake_expired, self.peer)
            self.set_nodelay(True)

        def on_message(self, message):
            if self.relay is not None:
                return self.relay.from_ws(message)
            if self.parser is None:
                self.peer.fail("sent data before it was paired")
                return
            key = self.parser.feed(message)
            if key is not None:
                unused, self.parser = self.parser.unused, None
                if unused:
                    self.peer.fail("sent data before it was paired")
                else:
                    self.service.handshake_done(self.peer, key)

        def on_close(self):
            if self.relay is not None:
                self.relay.close()
            else:
                self.service.peer_left(self.peer)
                self.peer.close()

    class TornadoProxy(ProxyService):
        async def start(self):
            address = await super().start()
            sockets = tornado.netutil.bind_sockets(0, self.config.host)
            app = tornado.web.Application([("/ws", Handler, {"service": self})])
            server = tornado.httpserver.HTTPServer(app, max_header_size=8192)
            server.add_sockets(sockets)
            self.web_address = sockets[0].getsockname()[:2]
            return address

        def _make_relay(self, a, b, *, to_a, to_b, on_close):
            if isinstance(a, TornadoPeer) and b.sock is not None:
                return TornadoRelay(self._loop, a, b.sock, to_a, to_b, on_close)
            if isinstance(b, TornadoPeer) and a.sock is not None:
                return TornadoRelay(self._loop, b, a.sock, to_b, to_a, on_close)
            return super()._make_relay(a, b, to_a=to_a, to_b=to_b, on_close=on_close)

    return TornadoProxy(config)


async def serve(mode: str) -> None:
    from kernelrpc.proxy.service import ProxyConfig, ProxyService

    config = ProxyConfig(port=0, web_port=None if mode == "tornado" else 0)
    service = tornado_service(config) if mode == "tornado" else ProxyService(config)
    host, port = await service.start()
    whost, wport = service.web_address
    print(f"listening on {host}:{port} (websocket ws://{whost}:{wport}/ws)", flush=True)
    await asyncio.Event().wait()


# -- peers (the bench process) --------------------------------------------------
class Proc:
    def __init__(self, args):
        env = dict(os.environ, PYTHONPATH=str(SRC), PYTHONUNBUFFERED="1")
        self.started = time.perf_counter()  # launch to ready line
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, start_new_session=True)
        for line in self.p.stdout:
            if m := READY.search(line):
                self.ready_s = time.perf_counter() - self.started
                self.tcp = (m.group(1), int(m.group(2)))
                self.web = (m.group(3), int(m.group(4)))
                threading.Thread(target=self.p.stdout.read, daemon=True).start()
                return
        raise RuntimeError(f"{args} exited before its ready line")

    def stop(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, 15)
        self.p.wait(10)


def start_proxy(mode: str) -> Proc:
    return Proc([sys.executable, __file__, "--serve", mode])


class WsPeer:
    def __init__(self, address):
        self.sock = socket.create_connection(address, timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.decoder = ws.FrameDecoder(require_mask=False)
        self.events = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(ws.encode_frame(ws.BINARY, data, mask=b"\x00\x00\x00\x00"))

    def read(self, n: int) -> int:
        got = 0
        while got < n:
            while not self.events:
                data = self.sock.recv(4 * MIB)
                if not data:
                    raise ConnectionError(f"closed after {got} of {n} bytes")
                self.events += self.decoder.feed(data)
            event = self.events.pop(0)
            if isinstance(event, ws.Data):
                got += len(event.payload)
        return got


def recv_exactly(sock, n: int) -> None:
    buf = bytearray(min(n, 4 * MIB))
    got = 0
    while got < n:
        k = sock.recv_into(buf, min(len(buf), n - got))
        if not k:
            raise ConnectionError("closed")
        got += k


def pair(proc: Proc) -> tuple[WsPeer, socket.socket]:
    device = WsPeer(proc.web)
    device.send(hs.encode_preamble(f"server:{KEY}"))
    client = socket.create_connection(proc.tcp, timeout=30)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client.sendall(hs.encode_preamble(f"client:{KEY}"))
    parser, reply = hs.ReplyParser(), None
    while reply is None:
        reply = parser.feed(client.recv(4096))
    assert reply.ok, reply
    parser, reply = hs.ReplyParser(), None
    while reply is None:
        event = device.events.pop(0) if device.events else None
        if event is None:
            device.events += device.decoder.feed(device.sock.recv(4096))
            continue
        reply = parser.feed(event.payload)
    assert reply.ok, reply
    return device, client


def cpu_s(proc: Proc) -> float:
    """User + system CPU seconds the proxy process has used so far."""
    fields = Path(f"/proc/{proc.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trip_us(proc: Proc, count: int) -> tuple[float, float]:
    """Median round trip of a 64-byte message, and the proxy's CPU per round trip (us)."""
    device, client = pair(proc)
    cpu = cpu_s(proc)
    msg = b"x" * 64
    samples = []
    for i in range(count):
        t = time.perf_counter()
        device.send(msg)
        recv_exactly(client, len(msg))
        client.sendall(msg)
        device.read(len(msg))
        samples.append(time.perf_counter() - t)
    cpu = cpu_s(proc) - cpu
    device.sock.close()
    client.close()
    return statistics.median(samples[count // 10:]) * 1e6, cpu / count * 1e6


def throughput(proc: Proc, total: int, chunk: int) -> tuple[float, float, float, float]:
    """MiB/s of ``total`` bytes TCP -> WebSocket, then WebSocket -> TCP (``chunk`` a message),
    and the proxy's CPU seconds for each."""
    device, client = pair(proc)
    block = os.urandom(chunk)
    cpu = cpu_s(proc)
    t = time.perf_counter()
    sender = threading.Thread(target=lambda: [client.sendall(block) for _ in range(total // chunk)])
    sender.start()
    device.read(total)
    sender.join()
    down = total / MIB / (time.perf_counter() - t)
    down_cpu, cpu = cpu_s(proc) - cpu, cpu_s(proc)
    frame = ws.encode_frame(ws.BINARY, block, mask=b"\x00\x00\x00\x00")  # zero mask: client cost out
    t = time.perf_counter()
    sender = threading.Thread(target=lambda: [device.sock.sendall(frame) for _ in range(total // chunk)])
    sender.start()
    recv_exactly(client, total)
    sender.join()
    up = total / MIB / (time.perf_counter() - t)
    up_cpu = cpu_s(proc) - cpu
    device.sock.close()
    client.close()
    return down, up, down_cpu, up_cpu


def import_ms(code: str, runs: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    best = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        best.append(time.perf_counter() - t)
    return min(best) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", choices=["codec", "tornado"], help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    if a.serve:
        asyncio.run(serve(a.serve))
        return
    runs, rtts, total = (2, 300, 16 * MIB) if a.quick else (5, 2000, 64 * MIB)
    keys = ("start", "rtt", "rtt_cpu", "down", "down_cpu", "up", "up_cpu", "up64k", "up64k_cpu")
    rows = {mode: {k: [] for k in keys} for mode in ("codec", "tornado")}
    for _ in range(runs):
        for mode, r in rows.items():  # interleaved: both see the same machine load
            proc = start_proxy(mode)
            try:
                r["start"].append(proc.ready_s * 1e3)
                for k, v in zip(("rtt", "rtt_cpu"), round_trip_us(proc, rtts)):
                    r[k].append(v)
                down, up, down_cpu, up_cpu = throughput(proc, total, MIB)
                _, up64k, _, up64k_cpu = throughput(proc, total, 64 << 10)
                for k, v in zip(keys[3:], (down, down_cpu, up, up_cpu, up64k, up64k_cpu)):
                    r[k].append(v)
            finally:
                proc.stop()
    med = statistics.median
    print(f"WebSocket peer <-> TCP peer through the proxy: median of {runs} interleaved runs "
          f"({total // MIB} MiB transfers, {os.cpu_count()} cores); MiB/s with the proxy's "
          f"CPU seconds in ()")
    print(f"{'endpoint':<9}{'start ms':>9}{'rtt us (cpu)':>14}{'TCP->WS, 1M sends':>20}"
          f"{'WS->TCP, 1M msgs':>19}{'WS->TCP, 64K msgs':>19}")
    for mode, r in rows.items():
        cells = [f"{med(r[k]):.0f} ({med(r[k + '_cpu']):.2f})" for k in ("down", "up", "up64k")]
        print(f"{mode:<9}{med(r['start']):>9.0f}{med(r['rtt']):>8.0f} ({med(r['rtt_cpu']):.0f})"
              f"{cells[0]:>20}{cells[1]:>19}{cells[2]:>19}")
    base = "import kernelrpc.proxy.__main__"
    codes = {"python -c pass": "pass", "the proxy (as started without --web-port)": base,
             "the proxy + tornado.web/websocket/httpserver":
                 base + "; import tornado.websocket, tornado.web, tornado.httpserver"}
    best = {label: float("inf") for label in codes}
    for _ in range(10):  # interleaved, best of 10
        for label, code in codes.items():
            best[label] = min(best[label], import_ms(code, 1))
    print("\nimport cost (a fresh interpreter, best of 10):")
    for label, ms in best.items():
        print(f"  {label:<46}{ms:>7.0f} ms")

if __name__ == "__main__":
    main()
