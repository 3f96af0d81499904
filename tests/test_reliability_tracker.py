"""The tracker under attack by local processes: each test is one attack from issue 14, on a real
tracker process, and checks that honest peers are still served."""
import json
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

from conftest import wait_until
from kernelrpc.rpc.tracker_client import connect_tracker
from servicectl import child_env, free_port
from tracker_peers import MAGIC, Raw


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def closed_by_tracker(sock):
    """Whether the tracker has closed ``sock`` (reads what is there without waiting)."""
    sock.settimeout(None)               # in timeout mode, MSG_DONTWAIT would wait for the timeout
    try:
        while True:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def summary(addr):
    with connect_tracker(*addr) as session:
        return session.summary()


def query(port):
    return subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--host", "127.0.0.1",
                           "--port", str(port)], capture_output=True, text=True, env=child_env(), timeout=30)


def test_requests_for_made_up_keys_do_not_pile_up_and_requests_go_on(tracker, peers):
    flooders = [peers() for _ in range(4)]
    for flooder in flooders:
        frames = b"".join(struct.pack("<i", len(d)) + d for d in
                          (json.dumps([4, secrets.token_hex(128), "", 1]).encode() for _ in range(1024)))
        flooder.sock.sendall(frames)
    refused = [flooder.recv() for flooder in flooders for _ in range(1024 - 16)]
    assert all(reply[0] == -1 and "no server has offered" in reply[1] for reply in refused)
    server = peers()
    server.register("board", 9000, "board:1", protocol="kernelrpc/1")  # a kernelrpc server
    with connect_tracker(*tracker.address) as session:
        info = session.summary()
        assert sum(q["pending"] for q in info["queue_info"].values()) == 4 * 16
        assert session.request_address("board", timeout=10) == ("127.0.0.1", 9000, "board:1")
    for flooder in flooders:
        flooder.close()
    wait_until(lambda: len(summary(tracker.address)["queue_info"]) == 1, what="junk queues gone")
    assert query(tracker.port).returncode == 5          # all busy: the one slot is leased


def test_summary_is_cut_to_fit_a_frame_and_says_so(tracker, peers):
    big = "x" * 15_000
    for i in range(100):                                 # 1.5 MB of server info in all
        assert peers().call([5, {"key": f"server:k{i}", "addr": [None, 9000 + i], "note": big}]) == 0
    with connect_tracker(*tracker.address) as session:
        info = session.summary()
        assert 0 < len(info["server_info"]) < 100
        assert info["truncated"] == {"server_info": 100 - len(info["server_info"])}
        assert "the tracker left out" in session.text_summary()
    result = query(tracker.port)
    assert result.returncode == 5 and "server:k" in result.stdout


def test_unread_replies_do_not_grow_the_tracker_and_others_are_served(tracker, peers):
    big = "x" * 15_000
    for i in range(20):                                  # a 300 KB summary
        assert peers().call([5, {"key": f"server:k{i}", "addr": [None, 9000 + i], "note": big}]) == 0
    ping = peers()
    assert ping.call([1]) == 0
    before = rss_kib(tracker.proc.pid)
    hogs = [peers() for _ in range(2)]
    for hog in hogs:
        hog.sock.sendall((struct.pack("<i", 3) + b"[6]") * 300)   # 180 MB of replies if all were made
    for _ in range(20):
        assert ping.call([1]) == 0
    time.sleep(0.5)                                      # let the tracker work through what it read
    assert ping.call([1]) == 0
    grown = rss_kib(tracker.proc.pid) - before
    assert grown < 48 * 1024, f"tracker grew by {grown} KiB for replies nobody reads"
    reply = hogs[0].recv()                               # the replies come once the peer reads
    assert reply[0] == 0 and len(reply[1]["server_info"]) == 20


def test_silent_and_slowloris_connections_are_closed(start_service):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--frame-timeout", "1", "--idle-timeout", "2"])
    magic_only = Raw(tracker.address)
    half_frame = Raw(tracker.address)
    half_frame.sock.sendall(struct.pack("<i", 100) + b"[1,")
    waiting = Raw(tracker.address)
    waiting.send([4, "board", "", 1])
    server = Raw(tracker.address)
    server.register("other", 9000, "other:1")
    assert half_frame.closed_by_peer(timeout=10)
    assert magic_only.closed_by_peer(timeout=10)
    threading.Event().wait(1.0)
    assert waiting.call([1]) == 0                        # still open: it holds a request
    assert server.call([1]) == 0
    tracker.wait_for_line("left a frame unfinished")
    tracker.wait_for_line("sent nothing for 2 s")


def test_a_connection_flood_does_not_shut_out_new_clients(start_service, tmp_path):
    """1,040 connections that send only the magic, against a tracker started with a soft
    descriptor limit of 1,024 (a common default)."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nulimit -Sn 1024\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--max-connections-per-host", "512"],
                            python=str(wrapper))
    with open(f"/proc/{tracker.proc.pid}/limits") as f:
        soft = int(next(line for line in f if line.startswith("Max open files")).split()[3])
    assert soft > 1024
    flood = []
    try:
        for _ in range(1040):
            s = socket.create_connection(tracker.address, timeout=10)
            s.sendall(MAGIC)
            flood.append(s)
        with connect_tracker(*tracker.address, connect_timeout=5) as session:
            session.ping()
        evicted = sum(map(closed_by_tracker, flood))
        assert evicted >= 500
    finally:
        for s in flood:
            s.close()


def test_listen_backlog_is_what_the_tracker_asks_for(tracker):
    out = subprocess.run(["ss", "-Hltn", f"sport = :{tracker.port}"], capture_output=True, text=True).stdout
    assert out.split()[2] == "1024"


def test_deeply_nested_frame_is_a_protocol_error(tracker, peers):
    bad = peers()
    body = b"[" * 200_000
    bad.sock.sendall(struct.pack("<i", len(body)) + body)
    reply = bad.recv()
    assert reply[0] == -1 and "nests" in reply[1]
    assert bad.closed_by_peer()
    assert peers().call([1]) == 0
    assert not any("Traceback" in line or "Fatal" in line for line in tracker.lines)


def test_control_characters_in_keys_are_not_printed_raw(tracker, peers):
    evil = "board\x1b[2J\x07"
    srv = peers()
    srv.register(evil, 9000, "m:1")
    result = query(tracker.port)
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "board\\x1b[2J\\x07" in result.stdout


def test_a_queued_request_survives_a_tracker_restart(start_service):
    port = free_port()
    args = ["--port", str(port), "--port-end", str(port + 1)]
    tracker = start_service("kernelrpc.tracker", args)
    got = []
    session = connect_tracker("127.0.0.1", port)
    waiter = threading.Thread(target=lambda: got.append(session.request_address("board", timeout=30)))
    waiter.start()
    wait_until(lambda: summary(("127.0.0.1", port))["queue_info"].get("board", {}).get("pending"),
               what="request queued")
    tracker.stop()
    tracker = start_service("kernelrpc.tracker", args)
    wait_until(lambda: summary(("127.0.0.1", port))["queue_info"].get("board", {}).get("pending"),
               what="request queued again")
    server = Raw(("127.0.0.1", port))
    server.register("board", 9000, "board:9", protocol="kernelrpc/1")
    waiter.join(30)
    session.close()
    server.close()
    assert got == [("127.0.0.1", 9000, "board:9")]


def test_clients_skip_and_report_servers_they_cannot_reach(tracker, peers, start_service):
    bogus = peers()
    assert bogus.call([5, {"key": "server:board", "addr": [None, 1], "protocol": "kernelrpc/1"}]) == 0
    for i in range(20):                                  # ports nobody listens on
        assert bogus.call([3, "board", [free_port(), f"board:bogus{i}"], None]) == 0
    tarpit = socket.socket()                             # accepts connections (backlog) and never answers
    tarpit.bind(("127.0.0.1", 0))
    tarpit.listen(8)
    slow = peers()
    assert slow.call([5, {"key": "server:board", "addr": [None, tarpit.getsockname()[1]],
                          "protocol": "kernelrpc/1"}]) == 0
    assert slow.call([3, "board", [tarpit.getsockname()[1], "board:tarpit"], None]) == 0
    start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}", "--key", "board"])
    wait_until(lambda: summary(tracker.address)["queue_info"]["board"]["free"] == 22, what="real server registered")
    try:
        with connect_tracker(*tracker.address) as session:
            with session.request("board", max_retry=3, timeout=20, connect_timeout=2,
                                 handshake_timeout=0.5) as sess:
                assert sess.info["server"] == "kernelrpc"
            assert summary(tracker.address)["queue_info"]["board"]["free"] <= 1   # bogus ones held back
            assert bogus.call([7]) != []                 # still listed as pending to their server
    finally:
        tarpit.close()
    tracker.wait_for_line("could not reach.*held back")


def flood_requests(peer, key, count):
    frames = (json.dumps([4, key, "kernelrpc/1", 1]).encode() for _ in range(count))
    peer.sock.sendall(b"".join(struct.pack("<i", len(d)) + d for d in frames))


def pending(tracker, key="board"):
    return summary(tracker.address)["queue_info"].get(key, {}).get("pending", 0)


class Honest(threading.Thread):
    """A client on a connection of its own that waits for a board."""

    def __init__(self, tracker):
        super().__init__(daemon=True)
        self.tracker, self.address, self.error = tracker, None, None

    def run(self):
        try:
            with connect_tracker(*self.tracker.address) as session:
                self.address = session.request_address("board", timeout=15)
        except Exception as exc:  # reported by the test
            self.error = exc


def test_one_connection_holding_many_requests_does_not_shut_out_another_client(tracker, peers):
    server = peers()
    server.register("board", 9000, "board:1", protocol="kernelrpc/1")
    greedy = peers()
    flood_requests(greedy, "board", 1024)             # the most one connection may hold
    assert greedy.recv()[0] == 0                      # the free board: it never connects to it
    wait_until(lambda: pending(tracker) == 1023)
    honest = Honest(tracker)
    honest.start()
    wait_until(lambda: pending(tracker) == 1024)
    for port in (2, 3):                               # the next boards come free: one turn each
        assert server.call([3, "board", [9000, f"board:{port}"], None]) == 0
    honest.join(30)
    assert honest.error is None and honest.address == ("127.0.0.1", 9000, "board:3")


def test_connections_of_one_host_share_its_request_limit(tracker, peers):
    server = peers()
    server.register("board", 9000, "board:1", protocol="kernelrpc/1")
    greedy = [peers() for _ in range(4)]
    for peer in greedy:
        flood_requests(peer, "board", 1024)
    assert greedy[0].recv()[0] == 0                   # the free board
    wait_until(lambda: pending(tracker) == 4095)
    flood_requests(greedy[1], "board", 1)
    assert "more than 1024 waiting requests on one connection" in greedy[1].recv()[1]
    honest = Honest(tracker)
    honest.start()
    wait_until(lambda: pending(tracker) == 4096)      # the host's limit
    late = peers()
    flood_requests(late, "board", 1)                  # the heaviest connection makes room for it
    reply = greedy[1].recv()
    assert reply[0] == -1 and "limit per host" in reply[1] and "held the most (1024)" in reply[1]
    assert pending(tracker) == 4096
    for port in range(2, 6):                          # one turn per connection: greedy 0, 2, 3, honest
        assert server.call([3, "board", [9000, f"board:{port}"], None]) == 0
    honest.join(30)
    assert honest.error is None and honest.address == ("127.0.0.1", 9000, "board:5")
