"""A bench-only proxy whose relay is a BPF sockhash, and a probe of its backpressure.

    PYTHONPATH=src python bench/sockmap_relay.py --serve          # prints "listening on H:P"
    PYTHONPATH=src python bench/sockmap_relay.py --probe [MiB]    # sockmap vs splice proxy

Not part of ``kernelrpc.proxy`` on purpose: on Linux 6.18 an ``sk_skb`` redirect to
another socket's egress has no backpressure (see docs/proxy.md, "In-kernel relay").
``--serve`` speaks just enough of the proxy protocol for bench/proxy.py: it pairs
``server:K`` with ``client:K`` (device reply first: TVM devices only ever answer),
puts both sockets into the map and closes both when either hangs up.  ``--probe``
sends into a device that never reads and reports how much the sender got rid of
before blocking, with the kernel's view of the sockets' memory.
"""
from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from bpf_sockmap import Sockmap, SockmapUnavailable  # noqa: E402
from kernelrpc.errors import ProtocolError  # noqa: E402
from kernelrpc.wire import handshake as hs  # noqa: E402

MIB = 1 << 20
SO_MEMINFO = getattr(socket, "SO_MEMINFO", 55)
MEMINFO = struct.Struct("=9I")  # SK_MEMINFO_RMEM_ALLOC, RCVBUF, WMEM_ALLOC, SNDBUF, FWD_ALLOC,
                                # WMEM_QUEUED, OPTMEM, BACKLOG, DROPS
HANGUP = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR


def serve(max_pairs: int = 64) -> None:
    sockmap = Sockmap(2 * max_pairs)
    listener = socket.create_server(("127.0.0.1", 0))
    print("sockmap relay listening on 127.0.0.1:%d" % listener.getsockname()[1], flush=True)
    ep = select.epoll()
    ep.register(listener.fileno(), select.EPOLLIN)
    handshaking: dict[int, tuple[socket.socket, hs.PreambleParser]] = {}
    waiting: dict[tuple[str, str], list[tuple[socket.socket, str]]] = {}
    pairs: dict[int, tuple[socket.socket, socket.socket]] = {}  # fd -> (its socket, partner)
    while True:
        for fd, events in ep.poll():
            if fd == listener.fileno():
                sock, _ = listener.accept()
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                handshaking[sock.fileno()] = (sock, hs.PreambleParser())
                ep.register(sock.fileno(), select.EPOLLIN)
            elif fd in handshaking:
                sock, parser = handshaking[fd]
                data = sock.recv(4096)
                try:
                    key = parser.feed(data) if data else None
                except ProtocolError:
                    key = None
                    data = b""
                if not data:
                    ep.unregister(fd)
                    del handshaking[fd]
                    sock.close()
                    continue
                if key is None:
                    continue
                ep.unregister(fd)
                del handshaking[fd]
                parsed = hs.parse_key(key)
                other = "client" if parsed.role == "server" else "server"
                peers = waiting.get((other, parsed.matchkey))
                if not peers:
                    waiting.setdefault((parsed.role, parsed.matchkey), []).append((sock, key))
                    continue
                peer, peer_key = peers.pop(0)
                device, client = ((sock, peer) if parsed.role == "server" else (peer, sock))
                device_key, client_key = ((key, peer_key) if parsed.role == "server"
                                          else (peer_key, key))
                sockmap.add_pair(device, client)
                device.sendall(hs.encode_reply(hs.RPC_CODE_SUCCESS, client_key))
                client.sendall(hs.encode_reply(hs.RPC_CODE_SUCCESS, device_key))
                pairs[device.fileno()], pairs[client.fileno()] = (device, client), (client, device)
                for s in (device, client):
                    ep.register(s.fileno(), HANGUP)
            elif fd in pairs and events & HANGUP:
                for sock in pairs.pop(fd):
                    pairs.pop(sock.fileno(), None)
                    ep.unregister(sock.fileno())
                    sock.close()  # closing takes it out of the map


def meminfo(sock: socket.socket) -> tuple[int, ...]:
    return MEMINFO.unpack(sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, MEMINFO.size))


def _connect(address, key: str) -> socket.socket:
    sock = socket.create_connection(address)
    sock.sendall(hs.encode_preamble(key))
    return sock


def _await_reply(sock: socket.socket) -> None:
    parser = hs.ReplyParser()
    reply = None
    while reply is None:
        reply = parser.feed(sock.recv(4096))
    reply.raise_for_code("proxy")


def probe(address, cap: int, seconds: float = 3.0) -> int:
    """Bytes a client gets rid of through ``address`` while the device never reads (<= cap)."""
    device = _connect(address, "server:probe")
    client = _connect(address, "client:probe")
    _await_reply(device)
    _await_reply(client)
    client.setblocking(False)
    chunk = bytes(MIB)
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while sent < cap and time.monotonic() < deadline:
            try:
                sent += client.send(chunk)
            except BlockingIOError:
                select.select([], [client], [], 0.05)
    finally:
        client.close()
        device.close()
    return sent


def _start(args: list[str], ready: str):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"))
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if ready in line:
            host, port = line.split()[-1].rsplit(":", 1)
            return proc, (host, int(port))
    raise RuntimeError(f"{args} exited before printing {ready!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true")
    p.add_argument("--probe", type=int, nargs="?", const=256, metavar="MiB",
                   help="send at most this much into a device that never reads (default 256)")
    args = p.parse_args()
    if args.serve:
        try:
            serve()
        except SockmapUnavailable as exc:
            raise SystemExit(f"sockmap unavailable: {exc}")
        return
    cap = (args.probe or 256) * MIB
    procs = []
    try:
        procs.append(("sockmap", _start([__file__, "--serve"], "listening on")))
        procs.append(("ours (splice)", _start(["-m", "kernelrpc.proxy", "--port", "0",
                                               "--log-level", "WARNING"], "listening on")))
        print(f"client sends into a device that never reads, for 3 s, at most {cap // MIB} MiB")
        for name, (_, address) in procs:
            sent = probe(address, cap)
            verdict = "blocked (backpressure)" if sent < cap else "never blocked"
            print(f"{name:<16} accepted {sent / MIB:8.1f} MiB: {verdict}")
    finally:
        for _, (proc, _) in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
