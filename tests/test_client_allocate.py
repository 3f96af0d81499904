"""The pipelined ``empty()`` (ALLOCATE, no reply): the client sends it with its next request, only
for what the server's checks will pass, so every error but a genuine failure on the device is
raised where it was before; that failure is raised, typed, by the tensor's first use. Against
real servers, and the client's channel against a socket whose far end the test reads."""
import gc
import resource
import socket

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.wire import connection as connection_module
from kernelrpc.wire import protocol as P
from kernelrpc.wire.hello import HelloReplyParser, encode_hello_accept
from kernelrpc.rpc.channel import Channel
from kernelrpc.wire.requests import CLIENT_IDS_FIRST, CopyTo, ListGlobals, Op
from kernelrpc.wire.values import DeviceValue, TensorHandle, decode_values
from test_client_api import kernels, server, session  # noqa: F401 (the client tests' server: tensors up to 1 MB)

CPU = DeviceValue("cpu", 0)


def frames_sent(peer: socket.socket) -> list:
    """(op, values) of every REQUEST frame the channel wrote so far."""
    reader, out = P.FrameReader(), []
    peer.setblocking(False)
    try:
        while True:
            reader.feed(peer.recv(1 << 16))
    except BlockingIOError:
        pass
    while (frame := reader.next_frame()) is not None:
        out.append((frame.body[0], decode_values(frame.body, 1)))
    return out


@pytest.fixture
def channel():
    ours, peer = socket.socketpair()
    info = HelloReplyParser().feed(encode_hello_accept(
        {"max_session_bytes": 100, "max_client_tensors": 2, "max_tensor_bytes": 80})).info
    yield Channel(ours, info, "test"), peer
    ours.close()
    peer.close()


def test_allocations_go_out_with_the_next_request_in_order_with_the_frees(channel):
    ch, peer = channel
    first = ch.allocate("float32", (16,), CPU, 64)
    assert first.id == CLIENT_IDS_FIRST and frames_sent(peer) == []   # nothing sent yet
    assert ch.allocate("float32", (16,), CPU, 64) is None             # 128 > 100: the server would refuse
    ch.release(first)
    second = ch.allocate("float32", (16,), CPU, 64)                   # fits once the first is freed
    third = ch.allocate("int8", (4,), CPU, 4)
    assert ch.allocate("int8", (1,), CPU, 1) is None                  # max_client_tensors
    assert ch.allocate("int8", (81,), CPU, 81) is None                # max_tensor_bytes
    peer.sendall(P.encode_return([[]]))
    assert ch.request(ListGlobals()) == [[]]
    assert frames_sent(peer) == [(Op.ALLOCATE, [first]), (Op.RELEASE, [first.id]), (Op.ALLOCATE, [second]),
                                 (Op.ALLOCATE, [third]), (Op.LIST_GLOBALS, [])]
    assert (ch.account.tensor_bytes, ch.account.client_tensors) == (68, 2)
    ch.release(second)
    ch.release(third)
    peer.sendall(P.encode_return([[]]))
    ch.request(ListGlobals())
    assert frames_sent(peer) == [(Op.RELEASE, [second.id, third.id]), (Op.LIST_GLOBALS, [])]
    assert (ch.account.tensor_bytes, ch.account.client_tensors) == (0, 0)


def test_allocations_without_any_request_are_sent_before_the_queue_grows_long(channel):
    ch, peer = channel
    for _ in range(connection_module.MAX_QUEUED):
        ch.release(ch.allocate("float32", (1,), CPU, 4))
    sent = frames_sent(peer)
    assert sent and {op for op, _ in sent} == {Op.ALLOCATE, Op.RELEASE}
    assert len(ch.connection.queued) < connection_module.MAX_QUEUED


def test_a_device_or_layout_the_client_cannot_vouch_for_is_not_pipelined(channel):
    ch, _ = channel
    assert ch.allocate("float32", (1,), DeviceValue("gpu", 0), 4) is None
    assert ch.allocate("float32", (1,), CPU, None) is None    # the layout did not check out


def test_an_older_server_gets_an_array_with_a_reply(server, monkeypatch):
    monkeypatch.setattr(connection_module, "served_optional_ops",
                        lambda info: frozenset({Op.RELEASE, Op.ARRAY, Op.TIME_EVALUATOR_PACKED}))
    with rpc.connect(server.host, server.port) as sess:
        tensor = nd.empty((3,), "int32", sess.cpu(0))
        assert tensor._handle.id < CLIENT_IDS_FIRST and not sess.channel.connection.queued
        np.testing.assert_array_equal(tensor.numpy(), np.zeros(3, "int32"))


def test_empty_is_pipelined_and_its_tensor_works_as_any_other(session, kernels):
    live = session.get_function("session.live_handles")
    before = live()
    a = nd.empty((1024,), "float32", session.cpu(0))
    assert a._handle.id >= CLIENT_IDS_FIRST and session.channel.connection.queued   # waiting for the next request
    b = nd.empty((1024,), "float32", session.cpu(0)).copyfrom(np.arange(1024, dtype="float32"))
    assert live() == before + 2
    np.testing.assert_array_equal(a.numpy(), np.zeros(1024))
    kernels["addone"](b, a)
    np.testing.assert_array_equal(a.numpy(), np.arange(1024) + 1)
    a.free()
    del b
    gc.collect()
    assert live() == before
    assert session.channel.account.tensor_bytes == 0


def test_the_errors_of_empty_arise_at_empty(session):
    with pytest.raises(kernelrpc.RemoteError, match="max_tensor_bytes"):
        nd.empty((300_000,), "float32", session.cpu(0))           # 1.2 MB: over the server's 1 MB
    with pytest.raises(kernelrpc.RemoteError, match="ARRAY: unsupported dtype"):
        session.empty((2,), "complex64")
    with pytest.raises(kernelrpc.RemoteError, match="ARRAY: bad shape"):
        session.empty((2, -1), "float32")
    assert session.get_function("testing.echo")("still here") == "still here"


def test_the_session_limit_is_met_at_empty_with_pipelining(start_service):
    server = start_service("kernelrpc.server", ["--port", "0", "--max-session-bytes", str(1 << 20)])
    with rpc.connect(server.host, server.port) as sess:
        assert sess.info["max_session_bytes"] == 1 << 20
        kept = [nd.empty((1 << 16,), "float32", sess.cpu(0)) for _ in range(4)]   # 4 x 256 KiB: all of it
        assert all(t._handle.id >= CLIENT_IDS_FIRST for t in kept)
        with pytest.raises(kernelrpc.RemoteError, match="per session"):
            nd.empty((1,), "int8", sess.cpu(0))
        kept.pop().free()
        del kept[0]
        again = [nd.empty((1 << 16,), "float32", sess.cpu(0)) for _ in range(2)]   # room for two
        assert all(t._handle.id >= CLIENT_IDS_FIRST for t in again)
        np.testing.assert_array_equal(again[1].numpy()[:3], np.zeros(3))


def _address_space_limit(nbytes: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))


def test_a_genuine_allocation_failure_is_raised_by_the_first_use_and_names_the_tensor(start_service):
    """The server's address space is limited to 1 GiB (RLIMIT_AS, inherited by its session child),
    which the client does not know: a 2 GiB tensor passes its checks, is pipelined, and fails."""
    server = start_service("kernelrpc.server", ["--port", "0", "--max-session-bytes", str(4 << 30)],
                           preexec_fn=_address_space_limit(1 << 30))
    with rpc.connect(server.host, server.port) as sess:
        big = sess.empty((1 << 29,), "float32")                       # 2 GiB, within the announced limits
        assert big._handle.id >= CLIENT_IDS_FIRST
        small = sess.empty((2,), "float32").copyfrom(np.ones(2, "float32"))   # the same write: unharmed
        with pytest.raises(kernelrpc.AllocationFailed, match=rf"tensor {big._handle.id} \(float32\[536870912\]\) "
                                                              r"could not be allocated.*Cannot allocate memory") as info:
            big.numpy()
        assert info.value.type_name == "AllocationFailed" and "mmap" in info.value.traceback_text
        with pytest.raises(kernelrpc.AllocationFailed):
            sess.get_function("testing.echo")(big)                    # every use, until it is freed
        np.testing.assert_array_equal(small.numpy(), np.ones(2))
        big.free()
        with pytest.raises(kernelrpc.RemoteError, match="no tensor with handle"):
            sess.channel.request_with_raw(CopyTo(big._handle, 0, 4), memoryview(bytes(4)), None)
        assert sess.get_function("session.live_handles")() == 1     # small; the echo function was dropped


def send_and_read_reply(sess, frame: bytes):
    """A misbehaving client's ALLOCATE, which has no reply: what the server answers.

    Nothing follows it here: bytes the server never reads when it ends the session would make
    its close a reset, which may reach the client before the answer does."""
    sess.channel.conn.send(frame)
    return sess.channel.expect(sess.channel.receive(), P.RETURN)


@pytest.mark.parametrize("values, message", [
    ([TensorHandle(7, "float32", (1,), CPU)], "outside the ids a client may choose"),
    ([TensorHandle(2**64 - 1, "float32", (1,), CPU)], "outside the ids a client may choose"),
    ([CLIENT_IDS_FIRST], "ALLOCATE: tensor must be TensorHandle"),
])
def test_a_bad_allocate_ends_the_session_with_a_protocol_error(server, values, message):
    assert_ends_the_session(server, P.encode_request(P.ALLOCATE, values), f"ALLOCATE refused, the session ends: .*{message}")


def assert_ends_the_session(server, frame: bytes, error: str) -> None:
    """A request without a reply that the server refuses: it answers ``error`` and ends the
    session, and goes on serving others."""
    with rpc.connect(server.host, server.port) as sess:
        with pytest.raises(kernelrpc.RemoteError, match=error):
            send_and_read_reply(sess, frame)
        with pytest.raises(kernelrpc.ConnectionLost):
            sess.list_global_func_names()
    with rpc.connect(server.host, server.port) as other:              # the server goes on
        assert other.get_function("testing.echo")(3) == 3


def test_a_duplicate_id_ends_the_session_and_the_tensor_under_it_is_not_replaced(server):
    with rpc.connect(server.host, server.port) as sess:
        mine = sess.empty((2,), "float32").copyfrom(np.ones(2, "float32"))
        again = P.encode_request(P.ALLOCATE, [TensorHandle(mine._handle.id, "float32", (2,), CPU)])
        with pytest.raises(kernelrpc.RemoteError, match=f"id {mine._handle.id} is in use"):
            send_and_read_reply(sess, again)
    assert server.wait_for_line("protocol error, ending session: ALLOCATE refused")


def test_more_client_tensors_than_the_server_holds_end_the_session(server):
    with rpc.connect(server.host, server.port) as sess:
        bound = sess.info["max_client_tensors"]
        frames = b"".join(P.encode_request(P.ALLOCATE, [TensorHandle(CLIENT_IDS_FIRST + k, "int8", (0,), CPU)])
                          for k in range(bound + 1))
        with pytest.raises(kernelrpc.RemoteError, match="max_client_tensors"):
            send_and_read_reply(sess, frames)
