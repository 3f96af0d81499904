"""The README's lab recipe, typed as written on one host, and what goes wrong when it is not."""
import re
import shlex
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import wait_until
from servicectl import child_env, free_port
from kernelrpc.rpc.tracker_client import connect_tracker

README = Path(__file__).resolve().parents[1] / "README.md"


def recipe() -> list[list[str]]:
    """The commands of the README's "Using it" block, for one host: loopback, free ports."""
    text = README.read_text()
    section = text[text.index("## Using it"):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    ports = {}
    commands = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[:2] == ["python", "-m"], line
        words = [w.replace("tracker-host", "127.0.0.1").replace("proxy-host", "127.0.0.1")
                 .replace("0.0.0.0", "127.0.0.1") for w in words[2:]]
        for i, word in enumerate(words):
            for fixed in re.findall(r"\b9[0-9]{3}\b", word):
                ports.setdefault(fixed, str(free_port()))
                words[i] = word.replace(fixed, ports[fixed])
        commands.append(words)
    return commands


def test_readme_recipe_works_on_one_host(start_service):
    tracker_cmd, server_cmd, proxy_cmd, through_cmd, query_cmd = recipe()
    assert [c[0] for c in (tracker_cmd, server_cmd, proxy_cmd, through_cmd, query_cmd)] == [
        "kernelrpc.tracker", "kernelrpc.server", "kernelrpc.proxy", "kernelrpc.server", "kernelrpc.query_rpc_tracker"]
    tracker = start_service(tracker_cmd[0], tracker_cmd[1:])
    boards = [start_service(server_cmd[0], server_cmd[1:]) for _ in range(2)]   # two boards, one host
    proxy = start_service(proxy_cmd[0], proxy_cmd[1:])
    behind = start_service(through_cmd[0], through_cmd[1:], ready=re.compile("connected to proxy"))
    assert len({tracker.port, proxy.port, *(b.port for b in boards)}) == 4
    with connect_tracker(*tracker.address) as session:
        wait_until(lambda: session.summary()["queue_info"].get("rpi4", {}).get("free") == 3)
    query = subprocess.run([sys.executable, "-m", *query_cmd], capture_output=True, text=True,
                           env=child_env(), timeout=60)
    assert query.returncode == 0, query.stderr
    assert re.search(r"^rpi4\s+3\s+3\s+0\s*$", query.stdout, re.M), query.stdout   # two servers, one proxy
    with connect_tracker(*tracker.address) as session:
        remotes = [session.request("rpi4", session_timeout=60, timeout=30) for _ in range(3)]
        try:
            assert {r.address for r in remotes} == {f"127.0.0.1:{p}" for p in (proxy.port, *(b.port for b in boards))}
            for i, remote in enumerate(remotes):
                remote.upload(b"board %d" % i, "probe.bin")
                assert remote.download("probe.bin") == b"board %d" % i
        finally:
            for remote in remotes:
                remote.close()
    assert behind.proc.poll() is None


def test_proxy_port_taken_is_an_error_not_a_silent_move(start_service):
    board = start_service("kernelrpc.server", ["--port", "0", "--key", "rpi4"])
    out = subprocess.run([sys.executable, "-m", "kernelrpc.proxy", "--port", str(board.port)],
                         capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 1 and "listening on" not in out.stdout
    assert f"cannot listen on 127.0.0.1:{board.port}: Address already in use" in out.stderr
    assert "--port-end" in out.stderr
    tracker = subprocess.run([sys.executable, "-m", "kernelrpc.tracker", "--port", str(board.port)],
                             capture_output=True, text=True, env=child_env(), timeout=60)
    assert tracker.returncode == 1 and "Address already in use" in tracker.stderr
    # TVM's range search, when asked for: the ready line tells where the proxy went
    searching = start_service("kernelrpc.proxy", ["--port", str(board.port), "--port-end", str(board.port + 50)])
    assert board.port < searching.port < board.port + 50


def through_proxy(port: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelrpc.server", "--through-proxy", "--host", "127.0.0.1",
                           "--port", str(port), "--key", "rpi4"], capture_output=True, text=True,
                          env=child_env(), timeout=60)


@pytest.mark.parametrize("kind", ["kernelrpc", pytest.param("tvm", marks=pytest.mark.tvm)])
def test_through_proxy_server_stops_at_a_device_server(start_service, kind):
    if kind == "kernelrpc":
        board = start_service("kernelrpc.server", ["--port", "0", "--key", "rpi4"])
    else:
        pytest.importorskip("tvm.rpc", reason="apache-tvm is not installed", exc_type=ImportError)
        port = free_port()
        board = start_service("tvm.exec.rpc_server", ["--host", "127.0.0.1", "--port", str(port), "--port-end",
                                                      str(port + 1), "--key", "rpi4"],
                              ready=re.compile(r"bind to (\S+):(\d+)"), timeout=60)
    out = through_proxy(board.port)
    assert out.returncode == 2
    assert "answered MISMATCH at once to 'server:rpi4': it is a device server, not a proxy" in out.stderr


def test_through_proxy_server_stops_at_a_tracker(start_service):
    tracker = start_service("kernelrpc.tracker", ["--port", "0"])
    out = through_proxy(tracker.port)
    assert out.returncode == 2 and "it is not a proxy (a tracker?)" in out.stderr


def test_through_proxy_server_stops_at_a_foreign_service():
    listener = socket.create_server(("127.0.0.1", 0))

    def http_server():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=http_server, daemon=True).start()
    try:
        out = through_proxy(listener.getsockname()[1])
    finally:
        listener.close()
    assert out.returncode == 2 and "is not a proxy: bad handshake reply" in out.stderr
