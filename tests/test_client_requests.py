"""Requests against a real server: bad ones get a clear error and the session goes on; the
optional requests (RELEASE, ARRAY) and their fallbacks for servers that do not list them."""
import gc

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.wire import connection as connection_module
from kernelrpc.wire import protocol as P
from kernelrpc.wire.requests import Op
from kernelrpc.wire.values import DeviceValue, ModuleHandle, TensorHandle
from test_client_api import server, session  # noqa: F401 (the client tests' server: tensors up to 1 MB)


def send_raw_request(session, frame: bytes, raw: bytes = b""):
    """Send a hand-made request (as a misbehaving client would) and return what its reply means."""
    session.channel.conn.send(frame + raw)
    return session.channel.expect(session.channel.receive(), P.RETURN)


def assert_goes_on(session):
    assert session.get_function("testing.echo")("still here") == "still here"


CPU = DeviceValue("cpu", 0)
BAD_REQUESTS = {
    "number out of range": P.encode_request(P.TIME_EVALUATOR, [ModuleHandle(1), "f", CPU, 0, 1, 0.0, 0.0, 1, "", 1, 0]),
    "float field given an int": P.encode_request(P.TIME_EVALUATOR, [ModuleHandle(1), "f", CPU, 1, 1, 0, 0.0, 1, "", 1, 0]),
    "name of the wrong type": P.encode_request(P.GET_GLOBAL, [7]),
    "too many values": P.encode_request(P.LISTDIR, ["", ""]),
    "negative dimension": P.encode_request(P.EMPTY, [[4, -1], "float32", CPU]),
    "truncated body": P.encode_frame(P.REQUEST, P.encode_request(P.GET_GLOBAL, ["testing.echo"])[P.HEADER_SIZE:-2]),
    "bytes after the values": P.encode_frame(P.REQUEST, P.encode_request(P.LIST_GLOBALS)[P.HEADER_SIZE:] + b"\0"),
    "unknown op": P.encode_frame(P.REQUEST, bytes([99]) + P.encode_values([])),
}


@pytest.mark.parametrize("name", sorted(BAD_REQUESTS))
def test_a_bad_request_is_a_protocol_error_and_the_session_goes_on(session, name):
    with pytest.raises(kernelrpc.RemoteError, match="ProtocolError") as info:
        send_raw_request(session, BAD_REQUESTS[name])
    assert info.value.type_name == "ProtocolError"
    assert_goes_on(session)


def test_a_bad_copy_drops_its_raw_bytes_and_a_bad_release_is_only_logged(session, server):
    tensor = nd.empty((4,), "float32", session.cpu(0))
    bad = P.encode_request(P.COPY_TO, [tensor._handle.id, 0, 16])  # an int where the tensor handle belongs
    with pytest.raises(kernelrpc.RemoteError, match="COPY_TO: tensor must be TensorHandle"):
        send_raw_request(session, bad, b"x" * 16)
    session.channel.conn.send(P.encode_request(P.RELEASE, ["not an id"]))  # RELEASE has no reply
    assert_goes_on(session)
    assert server.wait_for_line("RELEASE failed")
    tensor.copyfrom(np.arange(4, dtype="float32"))
    np.testing.assert_array_equal(tensor.numpy(), np.arange(4))


def test_a_refused_array_keeps_the_stream_in_step(session):
    big = np.zeros(300_000, "float32")  # 1.2 MB: over the server's max_tensor_bytes
    with pytest.raises(kernelrpc.RemoteError, match="max_tensor_bytes"):
        nd.array(big, session.cpu(0))
    assert_goes_on(session)


def test_the_server_lists_its_optional_requests_and_the_client_uses_them(session):
    assert session.channel.connection.ops == {Op.RELEASE, Op.ARRAY, Op.TIME_EVALUATOR_PACKED, Op.ALLOCATE, Op.GLOBAL_AT}
    live = session.get_function("session.live_handles")
    before = live()
    arrays = [nd.array(np.full(3, i, "int32"), session.cpu(0)) for i in range(5)]
    assert [a.numpy().tolist() for a in arrays] == [[i] * 3 for i in range(5)]
    assert arrays[0].shape == (3,) and arrays[0].dtype == "int32"
    assert live() == before + 5
    del arrays
    gc.collect()
    assert live() == before  # one RELEASE went out in front of this call, without a reply of its own


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "float16", "float64"])
def test_array_round_trips_every_dtype_and_zero_sized_tensors(session, dtype):
    dev = session.cpu(0)
    data = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    np.testing.assert_array_equal(nd.array(data, dev).numpy(), data)
    assert nd.array(np.zeros((0, 4), dtype), dev).numpy().shape == (0, 4)
    zeros = nd.empty((2, 2), dtype, dev)
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((2, 2), dtype))


def test_a_server_without_the_optional_requests_gets_free_and_empty(server, monkeypatch):
    monkeypatch.setattr(connection_module, "served_optional_ops", lambda info: frozenset())
    with rpc.connect(server.host, server.port) as sess:
        assert sess.channel.connection.ops == frozenset()
        live = sess.get_function("session.live_handles")
        before = live()
        tensor = nd.array(np.arange(5, dtype="int64"), sess.cpu(0))
        assert isinstance(tensor._handle, TensorHandle)
        np.testing.assert_array_equal(tensor.numpy(), np.arange(5))
        functions = [sess.get_function("testing.echo") for _ in range(3)]
        assert live() == before + 4
        del tensor, functions
        gc.collect()
        assert live() == before  # a FREE, answered, went out in front of this call
        assert sess.get_function("testing.echo")(2.5) == 2.5


def test_the_hello_ops_list_is_checked():
    assert connection_module.served_optional_ops({}) == frozenset()
    assert connection_module.served_optional_ops({"ops": [16, 999]}) == {Op.RELEASE}
    with pytest.raises(kernelrpc.ProtocolError, match="ops"):
        connection_module.served_optional_ops({"ops": "16"})
    with pytest.raises(kernelrpc.ProtocolError, match="ops"):
        connection_module.served_optional_ops({"ops": list(range(1000))})


def test_a_whole_call_frame_without_a_function_handle_is_an_error_reply(session):
    with pytest.raises(kernelrpc.RemoteError, match="CALL needs a function handle"):
        send_raw_request(session, P.encode_request(P.CALL, [1, 2]))  # one whole frame: the fast path
    with pytest.raises(kernelrpc.RemoteError, match="no function with handle"):
        send_raw_request(session, P.encode_call(10**9, [1]))
    assert_goes_on(session)
