"""FramedSocket over a socket pair: the one-read fast path hands everything else to the frame reader."""
import socket

import pytest

from kernelrpc.errors import ConnectionLost
from kernelrpc.rpc import protocol as P
from kernelrpc.rpc.transport import FramedSocket


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    with a, b:
        yield a, FramedSocket(b)


def test_a_small_frame_arrives_in_one_chunk(pair):
    sender, conn = pair
    sender.sendall(P.encode_result(7))
    chunk = conn.recv_chunk()
    assert P.decode_result_frame(chunk, P.DEFAULT_MAX_FRAME_BYTES) == 7


def test_a_frame_longer_than_the_first_read_completes_through_recv_frame(pair):
    sender, conn = pair
    reply = P.encode_result("x" * 200_000)
    sender.sendall(reply + P.encode_result(1))
    chunk = conn.recv_chunk()
    assert len(chunk) < len(reply)
    assert P.decode_result_frame(chunk, P.DEFAULT_MAX_FRAME_BYTES) is P.NOT_ONE_FRAME
    conn.reader.feed(chunk)
    frame = conn.recv_frame()
    assert frame[0] == P.RETURN and P.decode_result(frame[1]) == "x" * 200_000
    assert P.decode_result(conn.recv_frame()[1]) == 1


def test_recv_chunk_defers_to_buffered_frames_and_reports_a_closed_peer(pair):
    sender, conn = pair
    sender.sendall(P.encode_result(1) + P.encode_result(2))
    conn.reader.feed(conn.recv_chunk())
    assert conn.recv_chunk() is None  # frames are buffered: recv_frame must read them first
    assert P.decode_result(conn.recv_frame()[1]) == 1
    assert P.decode_result(conn.recv_frame()[1]) == 2
    sender.close()
    with pytest.raises(ConnectionLost):
        conn.recv_chunk()
