"""What TLS costs a session: round trip and tensor copies, plain and TLS, in the same run.

    PYTHONPATH=src python bench/tls.py [--calls N] [--block B] [--sizes 1,16,64] [--pin same|none]

Starts two device servers (``python -m kernelrpc.server``), one plain and one with
``--tls-cert`` (a throw-away CA from ``trustme``), and measures against both:

* the round trip of ``testing.echo(1)``, call by call in small interleaved blocks
  (rotating which goes first, so load from other processes hits all rows alike): median,
  p99 and the ratio of the medians; next to a raw 32-byte ping-pong over plain TCP and
  over TLS (``ssl`` on both ends, no relay), the floor of each;
* tensor copies host -> device (``nd.array``) and device -> host (``.numpy()``) of
  each size, best of ``--repeat``, in MiB/s.

A TLS session runs behind a relay process (``kernelrpc.server.tls_relay``), so the
TLS row pays for the encryption and for one more hop over a socketpair each way.
By default client and servers share CPU 0 (``--pin same``), as ``bench/rpc.py`` does.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from kernelrpc import nd, rpc  # noqa: E402
from kernelrpc.deploy.launch import Service  # noqa: E402
from kernelrpc.wire.tls import TLSConfig  # noqa: E402


def make_certificates(directory: str) -> tuple[str, str]:
    import trustme

    ca = trustme.CA()
    ca_path, cert_path = os.path.join(directory, "ca.pem"), os.path.join(directory, "service.pem")
    ca.cert_pem.write_to_path(ca_path)
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(cert_path)
    return ca_path, cert_path


def raw_echo_servers(cert: str) -> tuple[int, int, int]:
    """Fork a process that echoes on one plain and one TLS port; returns (pid, plain, tls)."""
    import socket
    import ssl

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    pid = os.fork()
    if pid == 0:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert)
        conns = []
        for n, listener in enumerate(listeners):
            conn = listener.accept()[0]
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append(ctx.wrap_socket(conn, server_side=True) if n else conn)
        import selectors
        sel = selectors.DefaultSelector()
        for conn in conns:
            sel.register(conn, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                data = key.fileobj.recv(65536)
                if not data:
                    os._exit(0)
                key.fileobj.sendall(data)
    ports = [listener.getsockname()[1] for listener in listeners]
    for listener in listeners:
        listener.close()
    return pid, ports[0], ports[1]


def raw_pinger(port: int, ca: str | None):
    import socket
    import ssl

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ca:
        sock = ssl.create_default_context(cafile=ca).wrap_socket(sock, server_hostname="127.0.0.1")
    message = b"x" * 32

    def ping(_):
        sock.sendall(message)
        got = 0
        while got < len(message):
            got += len(sock.recv(64))
    return ping


def round_trips(sessions: dict, calls: int, block: int, extra: dict) -> dict[str, list[float]]:
    echoes = {name: sess.get_function("testing.echo") for name, sess in sessions.items()}
    echoes.update(extra)
    for echo in echoes.values():
        for _ in range(200):
            echo(1)
    times: dict[str, list[float]] = {name: [] for name in echoes}
    order = list(echoes)
    for start in range(0, calls, block):
        order = order[1:] + order[:1]
        for name in order:
            echo = echoes[name]
            for _ in range(min(block, calls - start)):
                t0 = time.perf_counter()
                echo(1)
                times[name].append(time.perf_counter() - t0)
    return times


def copy_rates(sess, mib: int, repeat: int) -> tuple[float, float]:
    data = np.random.default_rng(0).standard_normal((mib << 20) // 4).astype("float32")
    up, down = [], []
    remote = nd.array(data, sess.cpu(0))
    for _ in range(repeat):
        t0 = time.perf_counter()
        remote.copyfrom(data)
        up.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = remote.numpy()
        down.append(time.perf_counter() - t0)
    assert np.array_equal(back, data)
    return mib / min(up), mib / min(down)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=4000)
    p.add_argument("--block", type=int, default=100)
    p.add_argument("--sizes", default="1,16,64", help="tensor sizes in MiB")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--pin", choices=("same", "none"), default="same")
    args = p.parse_args()
    cpus = ["--cpus", "0"] if args.pin == "same" else []
    if args.pin == "same":
        os.sched_setaffinity(0, {0})
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert = make_certificates(tmp)
        servers = {"plain": Service("kernelrpc.server", ["--port", "0", "--key", "b", *cpus]),
                   "TLS": Service("kernelrpc.server", ["--port", "0", "--key", "b", "--tls-cert", cert, *cpus])}
        try:
            sessions = {"plain": rpc.connect(*servers["plain"].address, key="b"),
                        "TLS": rpc.connect(*servers["TLS"].address, key="b", tls=TLSConfig(cafile=ca))}
            pid, plain_port, tls_port = raw_echo_servers(cert)
            raw = {"raw TCP": raw_pinger(plain_port, None), "raw TLS": raw_pinger(tls_port, ca)}
            times = round_trips(sessions, args.calls, args.block, raw)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print(f"round trip of testing.echo(1), {args.calls} calls each, interleaved blocks of {args.block}, "
                  f"pin {args.pin}")
            print(f"{'':9}{'median us':>12}{'p99 us':>10}{'x plain':>9}")
            base = statistics.median(times["plain"])
            for name, row in times.items():
                row.sort()
                med = statistics.median(row)
                print(f"{name:9}{med * 1e6:12.1f}{row[int(len(row) * 0.99)] * 1e6:10.1f}{med / base:9.2f}")
            print("\ntensor copies (best of %d), MiB/s" % args.repeat)
            print(f"{'MiB':>5}{'plain up':>11}{'TLS up':>10}{'ratio':>7}{'plain down':>12}{'TLS down':>10}{'ratio':>7}")
            for mib in (int(s) for s in args.sizes.split(",")):
                plain = copy_rates(sessions["plain"], mib, args.repeat)
                tls = copy_rates(sessions["TLS"], mib, args.repeat)
                print(f"{mib:5}{plain[0]:11.0f}{tls[0]:10.0f}{tls[0] / plain[0]:7.2f}"
                      f"{plain[1]:12.0f}{tls[1]:10.0f}{tls[1] / plain[1]:7.2f}")
            for sess in sessions.values():
                sess.close()
        finally:
            for svc in servers.values():
                svc.stop()


if __name__ == "__main__":
    main()
