"""One tracker connection on a real asyncio transport (a socket pair), in process."""
import asyncio
import json
import socket
import struct

from kernelrpc.tracker.service import TrackerConnection, TrackerService

MAGIC = bytes.fromhex("71f20200")
OK = struct.pack("<i", 1) + b"0"


def frame(obj):
    data = json.dumps(obj).encode()
    return struct.pack("<i", len(data)) + data


async def exchange(chunks, reply_bytes):
    """Send each chunk as one segment, wait for its replies; return what came back per chunk and
    how many writes the connection's transport made."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    service = TrackerService()
    _, conn = await loop.connect_accepted_socket(lambda: TrackerConnection(service), ours)
    writes = []
    real_write = conn.transport.write
    conn.transport.write = lambda data: (writes.append(bytes(data)), real_write(data))
    theirs.setblocking(False)
    replies = []
    try:
        for chunk, expected in zip(chunks, reply_bytes):
            await loop.sock_sendall(theirs, chunk)
            got = b""
            while len(got) < expected:
                chunk = await asyncio.wait_for(loop.sock_recv(theirs, 65536), 5)
                assert chunk, f"closed after {len(got)} of {expected} bytes"
                got += chunk
            replies.append(got)
    finally:
        theirs.close()
        service.stop()
    return replies, writes


def test_replies_to_one_read_go_out_in_one_write():
    pipelined = (MAGIC + frame([5, {"key": "server:k", "addr": [None, 9000]}]) + frame([3, "k", [9000, "k:1"], None])
                 + frame([1]))
    replies, writes = asyncio.run(exchange([pipelined, frame([1])], [4 + 3 * len(OK), len(OK)]))
    assert replies == [MAGIC + OK * 3, OK]
    assert writes == [MAGIC, OK * 3, OK]


def test_a_match_for_the_reading_client_keeps_its_place_among_its_replies():
    pipelined = (MAGIC + frame([3, "k", [9000, "k:1"], None]) + frame([4, "k", "", 1]) + frame([1]))
    match = frame([0, ["?", 9000, "k:1"]])
    replies, writes = asyncio.run(exchange([pipelined], [4 + len(OK) + len(match) + len(OK)]))
    assert replies == [MAGIC + OK + match + OK]
    assert writes == [MAGIC, OK + match + OK]
