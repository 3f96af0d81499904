"""The proxy with TLS on (``--tls-ca``/``--tls-cert``): it terminates TLS on both sides and relays
plaintext between them; raw TLS peers speak the TVM handshake (``python -m kernelrpc.proxy``)."""
from __future__ import annotations

import os
import selectors
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest

from conftest import wait_until
from kernelrpc.errors import AuthenticationError
from kernelrpc.deploy.launch import child_env
from kernelrpc.wire import auth as A
from kernelrpc.wire.tls import PLAINTEXT_REFUSAL
from kernelrpc.wire import handshake as hs
from proxy_peers import connect, is_closed, read_reply, recv_exactly, wait_for_matches
from servicectl import queue, start_tracker


def tls_connect(address, key: str, tls_files, timeout: float = 15.0) -> ssl.SSLSocket:
    """A peer that speaks TLS, then TVM's handshake with ``key``."""
    context = tls_files.client().client_context()
    sock = context.wrap_socket(socket.create_connection(address, timeout=timeout),
                               server_hostname=address[0])
    sock.sendall(hs.encode_preamble(key))
    return sock


@pytest.fixture
def tls_proxy(proxy, tls_files):
    def start(*args: str):
        p = proxy(*tls_files.flags(), *args)
        wait_for_matches(p, r"relaying with copy \(TLS\) \(")
        return p
    return start


def tls_pair(p, tls_files, key="k"):
    device = tls_connect(p.address, f"server:{key}", tls_files)
    client = tls_connect(p.address, f"client:{key}", tls_files)
    reply, extra = read_reply(client)
    assert reply.ok and reply.key == f"server:{key}" and not extra
    reply, extra = read_reply(device)
    assert reply.ok and reply.key == f"client:{key}" and not extra
    return device, client


def exchange(a: ssl.SSLSocket, b: ssl.SSLSocket, nbytes: int, timeout: float = 60.0) -> None:
    """``nbytes`` a -> b and b -> a at the same time, from one thread: an SSL socket must not be
    read and written by two threads at once."""
    sent = {a: os.urandom(nbytes), b: os.urandom(nbytes)}
    got = {a: bytearray(), b: bytearray()}
    offset = {a: 0, b: 0}
    for sock in (a, b):
        sock.setblocking(False)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for sock in (a, b):
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while any(len(got[s]) < nbytes for s in (a, b)):
            assert time.monotonic() < deadline, f"stalled: {len(got[a])} and {len(got[b])} of {nbytes} bytes"
            for key, _ in selector.select(1.0):
                sock = key.fileobj
                while True:                           # what TLS has decrypted is not on the socket any more
                    try:
                        data = sock.recv(1 << 20)
                    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                        break
                    assert data, "the proxy closed the connection"
                    got[sock] += data
                try:
                    offset[sock] += sock.send(memoryview(sent[sock])[offset[sock]:offset[sock] + (256 << 10)]) \
                        if offset[sock] < nbytes else 0
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                if offset[sock] >= nbytes:
                    selector.modify(sock, selectors.EVENT_READ)
    for sock in (a, b):
        sock.setblocking(True)
        sock.settimeout(15)
    assert bytes(got[b]) == sent[a] and bytes(got[a]) == sent[b]


def test_tls_pairs_relay_both_ways_large_transfers_and_close_from_either_side(tls_proxy, tls_files):
    p = tls_proxy()
    assert "(TLS)" in wait_for_matches(p, r"listening on \S+")[0].string
    device, client = tls_pair(p, tls_files)
    for i in range(50):                      # request/reply, as a session does
        client.sendall(i.to_bytes(4, "little") * 8)
        assert recv_exactly(device, 32) == i.to_bytes(4, "little") * 8
        device.sendall(b"r" * 100)
        assert recv_exactly(client, 100) == b"r" * 100
    exchange(client, device, 16 << 20)       # beyond every buffer on the way: backpressure works
    client.close()                           # the client ends: the device is closed
    assert is_closed(device)
    device.close()
    device, client = tls_pair(p, tls_files, "k2")
    device.sendall(b"last words")
    device.close()                           # the device ends: what it sent arrives, then the close
    assert recv_exactly(client, 10) == b"last words"
    assert is_closed(client)
    client.close()


def test_a_peer_that_never_completes_the_tls_handshake_does_not_keep_its_slot(tls_proxy, tls_files):
    p = tls_proxy("--timeout-handshake", "1")
    silent = socket.create_connection(p.address, timeout=15)
    half = socket.create_connection(p.address, timeout=15)
    hello = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO())
    with pytest.raises(ssl.SSLWantReadError):
        hello.do_handshake()
    half.sendall(outgoing.read()[:50])       # half a ClientHello, then nothing
    device, client = tls_pair(p, tls_files)  # others are served meanwhile
    assert is_closed(silent) and is_closed(half)
    wait_for_matches(p, r"closing 127\.0\.0\.1:\d+: no complete handshake within 1s", 2)
    exchange(client, device, 1 << 16)
    for sock in (silent, half, device, client):
        sock.close()


def test_a_plain_peer_at_a_tls_proxy_is_refused_and_the_proxy_goes_on(tls_proxy, tls_files):
    p = tls_proxy()
    plain = connect(p.address, "server:k")
    assert recv_exactly(plain, 4) == PLAINTEXT_REFUSAL      # in plain TCP: "this service requires TLS"
    assert is_closed(plain)
    wait_for_matches(p, r"it speaks plain TCP, and this proxy takes TLS peers only")
    garbage = socket.create_connection(p.address, timeout=15)
    garbage.sendall(b"\x16\x03\x01\x00\x05hello")                 # a TLS record that is not a hello
    assert is_closed(garbage)
    wait_for_matches(p, r"TLS handshake failed")
    device, client = tls_pair(p, tls_files)
    exchange(client, device, 4096)


def test_a_tls_peer_at_a_plain_proxy_is_told_what_is_wrong(proxy, tls_files):
    p = proxy()
    with pytest.raises((ssl.SSLError, OSError)):
        tls_connect(p.address, "server:k", tls_files)
    wait_for_matches(p, r"it speaks TLS, and this proxy has TLS off")


@pytest.mark.parametrize("relay", ["native", "splice"])
def test_an_explicit_raw_relay_with_tls_fails_start_up(tls_files, relay):
    done = subprocess.run([sys.executable, "-m", "kernelrpc.proxy", "--port", "0", "--relay", relay,
                           *tls_files.flags()], env=child_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "listening" not in done.stdout
    assert f"--relay {relay} moves raw bytes and cannot re-encrypt TLS records" in done.stderr


@pytest.mark.parametrize("flags, error", [
    (["--web-port", "0", "--tls-ca", "{ca}", "--tls-cert", "{cert}"], "the WebSocket port speaks ws:// only"),
    (["--tls-ca", "{ca}"], "TLS needs --tls-cert"),
])
def test_tls_configurations_that_cannot_work_are_refused_at_start_up(tls_files, flags, error):
    flags = [f.format(ca=tls_files.ca, cert=tls_files.cert) for f in flags]
    done = subprocess.run([sys.executable, "-m", "kernelrpc.proxy", "--port", "0", *flags], env=child_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and error in done.stderr and "listening" not in done.stdout


class TLSTerminator:
    """A TLS listener in front of a plaintext tracker: only a TLS peer gets through."""

    def __init__(self, target, certfile: str) -> None:
        self.target = target
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certfile)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                peer = self.context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()
                continue
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            for src, dst in ((peer, upstream), (upstream, peer)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


def test_the_tracker_link_speaks_tls(start_service, tls_proxy, tls_files):
    tracker = start_tracker(start_service)
    terminator = TLSTerminator(tracker.address, tls_files.cert)
    try:
        p = tls_proxy("--tracker", "{}:{}".format(*terminator.address))
        wait_for_matches(p, "registered with tracker")
        device = tls_connect(p.address, "server:tlsdev", tls_files)
        wait_for_matches(p, r"offered tlsdev:\S+ to the tracker")
        wait_until(lambda: queue(tracker, "tlsdev")["free"] == 1)
        assert terminator.accepted == 1
        device.close()
    finally:
        terminator.close()


def authenticated(sock, key: str, token: bytes):
    """Answer the proxy's challenge inside the TLS stream, as an authenticating peer does."""
    auth = A.PeerAuth(token, key.encode(), "proxy")
    step = None
    while step is not True:
        data = sock.recv(4096)
        assert data, "the proxy closed the connection during authentication"
        step = auth.feed(data)
        if isinstance(step, bytes):
            sock.sendall(step)
    return sock


def test_authentication_runs_inside_tls(tls_proxy, tls_files, tmp_path):
    token = "lab-token-0123456789abcdef"
    (tmp_path / "token").write_text(token + "\n")
    p = tls_proxy("--auth-token-file", str(tmp_path / "token"))
    device = authenticated(tls_connect(p.address, "server:k", tls_files), "server:k", token.encode())
    client = authenticated(tls_connect(p.address, "client:k", tls_files), "client:k", token.encode())
    assert read_reply(client)[0].ok and read_reply(device)[0].ok
    exchange(client, device, 1 << 20)
    intruder = tls_connect(p.address, "server:k", tls_files)
    with pytest.raises(AuthenticationError, match="refused our auth token"):
        authenticated(intruder, "server:k", b"a guessed token of some length")
    wait_for_matches(p, "does not know the auth token")


def refused(sock) -> bool:
    """The proxy ended the TLS session instead of answering (an alert, a reset or EOF)."""
    try:
        return sock.recv(100) == b""
    except (ssl.SSLError, ConnectionResetError):
        return True


def test_mutual_tls_refuses_peers_without_a_client_certificate(proxy, tls_files):
    p = proxy(*tls_files.flags(client_cert=True))
    anonymous = tls_connect(p.address, "server:k", tls_files)     # TLS 1.3: refused after its Finished
    assert refused(anonymous)
    wait_for_matches(p, r"TLS handshake failed .*CERTIFICATE")
    context = tls_files.client(with_cert=True).client_context()
    pair = []
    for key in ("server:k", "client:k"):
        sock = context.wrap_socket(socket.create_connection(p.address, timeout=15), server_hostname="127.0.0.1")
        sock.sendall(hs.encode_preamble(key))
        pair.append(sock)
    device, client = pair
    assert read_reply(client)[0].ok and read_reply(device)[0].ok
    exchange(client, device, 4096)


def test_a_tracker_whose_certificate_is_not_trusted_is_not_registered_with(start_service, tls_proxy, tls_files):
    tracker = start_tracker(start_service)
    terminator = TLSTerminator(tracker.address, tls_files.untrusted_cert)
    try:
        p = tls_proxy("--tracker", "{}:{}".format(*terminator.address))
        wait_for_matches(p, r"cannot reach tracker .*CERTIFICATE_VERIFY_FAILED")
        tls_connect(p.address, "server:nope", tls_files).close()
        assert terminator.accepted == 0 and queue(tracker, "nope")["free"] == 0
    finally:
        terminator.close()
