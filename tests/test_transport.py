"""FramedSocket over a socket pair: one read for a small frame, the frame reader for the rest."""
import socket

import pytest

from kernelrpc.errors import ConnectionLost
from kernelrpc.wire import protocol as P
from kernelrpc.wire.connection import NOT_ONE_FRAME, ClientConnection
from kernelrpc.wire.transport import FramedSocket


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    with a, b:
        yield a, FramedSocket(b, reader=ClientConnection({
            "max_frame_bytes": P.DEFAULT_MAX_FRAME_BYTES, "max_tensor_bytes": 0, "max_session_bytes": 0,
            "max_client_tensors": 0, "globals": []}))


def test_a_small_frame_arrives_in_one_read(pair):
    sender, conn = pair
    sender.sendall(P.encode_result(7))
    frame = conn.recv_frame()
    assert frame.type == P.RETURN and P.decode_result(frame.body) == 7
    assert conn.reader.pending == 0
    sender.sendall(P.encode_result(8))
    chunk = conn.recv_chunk()
    assert conn.reader.result_from_read(chunk) == 8


def test_a_chunk_handed_back_goes_through_the_reader(pair):
    sender, conn = pair
    reply = P.encode_result("x" * 200_000)
    sender.sendall(reply + P.encode_result(1))
    chunk = conn.recv_chunk()
    assert len(chunk) < len(reply)
    assert conn.reader.result_from_read(chunk) is NOT_ONE_FRAME
    assert P.decode_result(conn.recv_frame(chunk)[1]) == "x" * 200_000
    assert conn.recv_chunk() is None  # the next frame is buffered: recv_frame takes it
    assert P.decode_result(conn.recv_frame()[1]) == 1


def test_a_frame_longer_than_the_first_read_and_the_frame_after_it(pair):
    sender, conn = pair
    reply = P.encode_result("x" * 200_000)
    sender.sendall(reply + P.encode_result(1))
    frame = conn.recv_frame()
    assert frame[0] == P.RETURN and P.decode_result(frame[1]) == "x" * 200_000
    assert P.decode_result(conn.recv_frame()[1]) == 1


def test_buffered_frames_come_first_and_a_closed_peer_is_reported(pair):
    sender, conn = pair
    sender.sendall(P.encode_result(1) + P.encode_result(2) + P.encode_data_header(3) + b"raw")
    assert P.decode_result(conn.recv_frame()[1]) == 1
    assert P.decode_result(conn.recv_frame()[1]) == 2
    assert P.decode_data_header(conn.recv_frame()[1]) == 3
    target = bytearray(3)
    conn.recv_raw_into(target)
    assert target == b"raw"
    sender.close()
    with pytest.raises(ConnectionLost):
        conn.recv_frame()


def test_a_frame_in_pieces(pair):
    sender, conn = pair
    frame = P.encode_call(9, ["y" * 1000])
    sender.sendall(frame[:3])
    sender.sendall(frame[3:600])
    sender.sendall(frame[600:])
    assert tuple(P.decode_request(conn.recv_frame()[1])) == (9, ["y" * 1000])
