"""The tracker process, driven over real sockets with raw protocol bytes."""
import json
import socket
import struct
import time

import pytest

from kernelrpc.errors import QueueTimeout, TrackerError
from kernelrpc.rpc.tracker_client import TrackerUnreachable, connect_tracker, format_summary
from conftest import wait_until
from tracker_peers import MAGIC, Raw  # noqa: F401  (Raw: kept importable from here)

@pytest.fixture
def tracker(start_service):
    return start_service("kernelrpc.tracker", ["--port", "0", "--lease-timeout", "1"])


def test_ready_line_and_tvm_byte_layouts(tracker, peers):
    assert tracker.lines[0] == f"kernelrpc.tracker listening on 127.0.0.1:{tracker.port}"
    p = peers()
    p.sock.sendall(bytes.fromhex("03000000") + b"[1]")
    assert p.read(5) == bytes.fromhex("01000000") + b"0"
    srv = peers()
    srv.register("testkey", 19090, "testkey:0.8880375067090914")
    srv.sock.sendall(bytes.fromhex("03000000") + b"[7]")
    assert srv.recv_raw() == b'["testkey:0.8880375067090914"]'
    p.sock.sendall(bytes.fromhex("15000000") + b'[4, "testkey", "", 1]')
    reply = p.recv_raw()
    assert reply == b'[0, ["127.0.0.1", 19090, "testkey:0.8880375067090914"]]'
    assert srv.call([7]) == []
    assert p.call([2, "tracker:wrong"]) == -1


def test_summary_shape_matches_tvm(peers):
    srv = peers()
    srv.register("testkey", 19090, "testkey:1")
    info = peers().call([6])
    assert info[0] == 0
    assert info[1]["queue_info"] == {"testkey": {"free": 1, "pending": 0}}
    assert info[1]["server_info"] == [{"key": "server:testkey", "addr": ["127.0.0.1", 19090]}]


def test_custom_addr_three_element_put_and_string_port(peers):
    srv = peers()
    assert srv.call([5, {"key": "server:cpp", "addr": [None, "9090"]}]) == 0
    assert srv.call([3, "cpp", ["9090", "cpp:0.5"]]) == 0
    assert srv.call([3, "cpp", [9091, "cpp:0.6"], "10.0.0.9"]) == 0
    cl = peers()
    assert cl.call([4, "cpp", "", 1]) == [0, ["127.0.0.1", "9090", "cpp:0.5"]]
    assert cl.call([4, "cpp", "", 1]) == [0, ["10.0.0.9", 9091, "cpp:0.6"]]


def test_priority_and_disconnected_client_skipped(peers):
    low, gone, high = peers(), peers(), peers()
    low.send([4, "k", "", 1])
    gone.send([4, "k", "", 5])
    high.send([4, "k", "", 5])
    observer = peers()
    wait_until(lambda: observer.call([6])[1]["queue_info"].get("k", {}).get("pending") == 3,
               what="three requests queued")
    gone.close()
    wait_until(lambda: observer.call([6])[1]["queue_info"]["k"]["pending"] == 2,
               what="the gone client's request dropped")
    srv = peers()
    srv.register("k", 1, "k:1")
    assert high.recv() == [0, ["127.0.0.1", 1, "k:1"]]
    assert srv.call([3, "k", [1, "k:2"], None]) == 0
    assert low.recv() == [0, ["127.0.0.1", 1, "k:2"]]


def test_server_disconnect_removes_slots_even_without_update_info(peers):
    srv = peers()
    assert srv.call([3, "k", [1, "k:stale"], None]) == 0       # TVM keeps this slot after close
    observer = peers()
    assert observer.call([6])[1]["queue_info"]["k"]["free"] == 1
    srv.close()
    wait_until(lambda: observer.call([6])[1]["queue_info"]["k"]["free"] == 0, what="the closed server's slot removed")


def test_lease_expires_for_server_reporting_sessions(peers):
    srv = peers()
    assert srv.call([5, {"key": "server:k", "addr": [None, 5], "session": "idle"}]) == 0
    assert srv.call([3, "k", [5, "k:1"], None]) == 0
    ghost = peers()
    assert ghost.call([4, "k", "", 1])[1][2] == "k:1"       # and never connects to the server
    ghost.close()
    waiter = peers()
    assert waiter.call([4, "k", "", 1])[1][2] == "k:1"       # back in the pool after the 1 s lease
    assert srv.call([5, {"key": "server:k", "addr": [None, 5], "session": "active"}]) == 0
    summary = waiter.call([6])[1]
    assert summary["queue_info"]["k"] == {"free": 0, "pending": 0}
    assert summary["leases"][0]["state"] == "session"
    assert summary["stats"]["k"]["expired_leases"] == 1      # the lease expired: the close did not free it


@pytest.mark.parametrize("opening", [b"GET / HTTP/1.1\r\n\r\n", bytes.fromhex("71f20f00")])
def test_bad_magic_is_closed_and_others_still_served(tracker, peers, opening):
    bad = peers(magic=False)
    bad.sock.sendall(opening)
    assert bad.closed_by_peer()
    assert peers().call([1]) == 0


@pytest.mark.parametrize("frame", [struct.pack("<i", 0), struct.pack("<i", -1), struct.pack("<i", (1 << 20) + 1)])
def test_bad_length_closes_connection(peers, frame):
    bad = peers()
    bad.sock.sendall(frame)
    assert bad.recv()[0] == -1
    assert bad.closed_by_peer()
    assert peers().call([1]) == 0


@pytest.mark.parametrize("msg", [[99], ["x"], {"a": 1}, [3, "k"], [3, "k", [70000, "k:1"]], [3, "", [1, "k:1"]],
                                 [4, "k", "", "high"], [4, "k" * 1000, "", 1], [5, {"key": "server:x"}],
                                 [5, {"addr": [None, "abc"]}], [0], [3, "k", [1, 5]]])
def test_bad_messages_get_typed_error_and_connection_goes_on(peers, msg):
    p = peers()
    reply = p.call(msg)
    assert reply[0] == -1 and isinstance(reply[1], str) and reply[1]
    assert p.call([1]) == 0


def test_invalid_json_is_refused(peers):
    p = peers()
    p.sock.sendall(struct.pack("<i", 4) + b"[1,]")
    assert p.recv()[0] == -1
    assert p.closed_by_peer()


def test_magic_and_frame_in_one_segment_is_accepted(peers):
    p = peers(magic=False)
    p.sock.sendall(MAGIC + struct.pack("<i", 3) + b"[1]")
    assert p.read(4) == MAGIC
    assert p.recv() == 0


def test_pipelined_and_split_frames(peers):
    p = peers()
    data = b"".join(struct.pack("<i", 3) + b"[1]" for _ in range(50))
    for i in range(0, len(data), 5):
        p.sock.sendall(data[i:i + 5])
    assert [p.recv() for _ in range(50)] == [0] * 50


def test_partial_frames_on_many_connections_and_frames_larger_than_a_read(peers):
    """Connections share one receive buffer: each keeps its own partial frame between reads."""
    a, b, c = peers(), peers(), peers()
    big = json.dumps([4, "k" * 200_000, "", 1]).encode()      # > 64 KiB: arrives in several reads
    put = json.dumps([3, "k", [9000, "k:1"], None]).encode()
    a.sock.sendall(struct.pack("<i", len(big)) + big[:70_000])
    b.sock.sendall(struct.pack("<i", len(put)) + put[:7])
    assert c.call([1]) == 0
    b.sock.sendall(put[7:])
    assert b.recv() == 0
    a.sock.sendall(big[70_000:])
    reply = a.recv()
    assert reply[0] == -1 and "key" in reply[1]
    assert a.call([4, "k", "", 1]) == [0, ["127.0.0.1", 9000, "k:1"]]


def test_port_range_binds_first_free(start_service, tracker):
    port = tracker.port
    nxt = start_service("kernelrpc.tracker", ["--port", str(port), "--port-end", str(port + 3)])
    assert nxt.port in (port + 1, port + 2)


def test_client_summary_text_and_queue_timeout(tracker, peers, caplog):
    srv = peers()
    srv.register("board", 7000, "board:1", protocol="kernelrpc/1")   # our client asks for its protocol
    with connect_tracker(*tracker.address) as session:
        text = session.text_summary()
        assert text == format_summary(session.summary())
        assert f"{'127.0.0.1:7000':21s}    server:board\n" in text
        assert session.request_address("board", timeout=5) == ("127.0.0.1", 7000, "board:1")
        start = time.monotonic()
        with caplog.at_level("WARNING"), pytest.raises(QueueTimeout, match="1 servers have this key, 0 free"):
            session.request_address("board", timeout=0.3)
        assert time.monotonic() - start >= 0.25                 # it waited its timeout out
        with caplog.at_level("WARNING"), pytest.raises(QueueTimeout):
            session.request("nosuchkey", timeout=0.1)
        assert "no server with key 'nosuchkey'" in caplog.text
        assert peers().call([6])[1]["queue_info"]["board"]["pending"] == 0


def test_client_errors_are_typed(tracker):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with pytest.raises(TrackerUnreachable, match="cannot reach tracker"):
        connect_tracker("127.0.0.1", port)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with pytest.raises(TrackerUnreachable, match="not a tracker"):
        connect_tracker(*listener.getsockname(), connect_timeout=0.3)
    listener.close()
    assert issubclass(TrackerUnreachable, TrackerError)


def test_info_cannot_grow_without_bound(peers):
    p = peers()
    big = "x" * 4000
    replies = [p.call([5, {"addr": [None, 1], f"k{i}": big}]) for i in range(6)]
    assert replies[:3] == [0, 0, 0]
    assert replies[-1][0] == -1 and "at most" in replies[-1][1]
    assert p.call([1]) == 0
