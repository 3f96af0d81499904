"""Tracker, device servers and clients as real processes, the way a team runs them."""
import signal
import threading

import pytest

from kernelrpc.errors import QueueTimeout, RPCError
from kernelrpc.rpc import connect_tracker
from conftest import wait_until
from servicectl import free_port, queue, start_server, start_tracker
from tracker_peers import Raw

until = wait_until  # kept importable from here, with start_server, start_tracker and queue


def roundtrip(sess, payload: bytes) -> bytes:
    sess.upload(payload, "probe.bin")
    return sess.download("probe.bin")


def test_two_servers_serve_concurrent_clients(start_service, tracker):
    servers = [start_server(start_service, tracker) for _ in range(2)]
    wait_until(lambda: queue(tracker)["free"] == 2)
    assert servers[0].wait_for_line(f"registered key board at tracker 127.0.0.1:{tracker.port}, "
                                    f"advertised 127.0.0.1:{servers[0].port}")
    errors, used = [], []

    def client(i):
        try:
            with connect_tracker(*tracker.address) as t:
                for j in range(3):
                    with t.request("board", session_timeout=30, timeout=30) as sess:
                        used.append(sess.address)
                        assert roundtrip(sess, b"%d-%d" % (i, j)) == b"%d-%d" % (i, j)
        except Exception as exc:  # reported below with the thread's context
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(used) == 12 and len(set(used)) == 2
    wait_until(lambda: queue(tracker)["free"] == 2)
    with connect_tracker(*tracker.address) as t:
        stats = t.summary()["stats"]["board"]
    assert stats["matches"] == 12 and stats["expired_leases"] == 0


def test_priority_order_and_client_leaving_the_queue(start_service, tracker):
    start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 1)
    holder = connect_tracker(*tracker.address).request("board", timeout=10)
    order = []

    def wait_for_turn(name, priority):
        with connect_tracker(*tracker.address) as t, t.request("board", priority=priority, timeout=30) as sess:
            order.append(name)
            roundtrip(sess, name.encode())

    # a client that gives up leaves the queue at once
    with pytest.raises(QueueTimeout, match="1 servers have this key, 0 free"):
        connect_tracker(*tracker.address).request("board", priority=100, timeout=0.3)
    assert queue(tracker)["pending"] == 0

    low = threading.Thread(target=wait_for_turn, args=("low", 1))
    low.start()
    wait_until(lambda: queue(tracker)["pending"] == 1)
    high = threading.Thread(target=wait_for_turn, args=("high", 5))
    high.start()
    wait_until(lambda: queue(tracker)["pending"] == 2)
    holder.close()
    low.join(30)
    high.join(30)
    assert order == ["high", "low"]


def test_server_killed_while_leased(start_service, tracker):
    servers = [start_server(start_service, tracker) for _ in range(2)]
    wait_until(lambda: queue(tracker)["free"] == 2)
    t = connect_tracker(*tracker.address)
    sess = t.request("board", session_timeout=30, timeout=10)
    victim = next(s for s in servers if sess.address.endswith(f":{s.port}"))
    victim.stop(signal.SIGKILL)
    with pytest.raises(RPCError):
        roundtrip(sess, b"x")
    with connect_tracker(*tracker.address) as probe:
        wait_until(lambda: len(probe.summary()["server_info"]) == 1)
    survivor = next(s for s in servers if s is not victim)
    with t.request("board", timeout=10) as again:
        assert again.address.endswith(f":{survivor.port}")
        assert roundtrip(again, b"y") == b"y"


def test_servers_re_register_after_tracker_restart(start_service):
    port = free_port()
    tracker = start_tracker(start_service, port)
    servers = [start_server(start_service, tracker) for _ in range(2)]
    wait_until(lambda: queue(tracker)["free"] == 2)
    tracker.stop()
    for server in servers:
        server.wait_for_line("lost the connection to tracker")
    tracker = start_tracker(start_service, port)
    wait_until(lambda: queue(tracker)["free"] == 2)
    with connect_tracker(*tracker.address) as t, t.request("board", timeout=10) as sess:
        assert roundtrip(sess, b"back") == b"back"


def test_server_logs_when_tracker_is_unreachable(start_service):
    server = start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{free_port()}",
                                                "--key", "board"])
    assert "cannot reach tracker" in server.wait_for_line("cannot reach tracker")


def test_lease_returns_when_client_never_arrives(start_service):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--lease-timeout", "1"])
    start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 1)
    with connect_tracker(*tracker.address) as t:
        ghost = t.request_address("board", timeout=10)        # and never connects
        with t.request("board", timeout=10) as sess:         # served once the 1 s lease expires
            assert sess.address.endswith(f":{ghost[1]}")
            assert roundtrip(sess, b"after lease") == b"after lease"
        stats = t.summary()["stats"]["board"]
    assert stats["expired_leases"] == 1 and stats["matches"] == 2


def test_request_retries_past_a_stale_slot(start_service, tracker, caplog):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "board", "--tracker",
                                                f"127.0.0.1:{free_port()}"])    # not registered: no tracker there
    stale = Raw(tracker.address)
    stale.register("board", server.port, "board:stale", protocol="kernelrpc/1")   # a slot the server does not know
    real = start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 2)
    with caplog.at_level("INFO", "kernelrpc.rpc.tracker_client"), connect_tracker(*tracker.address) as t:
        with t.request("board", timeout=10) as sess:
            assert sess.address.endswith(f":{real.port}")
    assert "did not accept the session (attempt 1 of 5)" in caplog.text
    stale.close()


def test_tracker_session_survives_tracker_restart(start_service):
    port = free_port()
    tracker = start_tracker(start_service, port)
    start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 1)
    with connect_tracker(*tracker.address) as t:
        assert t.summary()["queue_info"]["board"]["free"] == 1
        tracker.stop()
        tracker = start_tracker(start_service, port)
        wait_until(lambda: queue(tracker)["free"] == 1)
        with t.request("board", timeout=10) as sess:           # the old link is reopened
            assert roundtrip(sess, b"same session object") == b"same session object"
