"""The pipelined ``get_function`` (GLOBAL_AT, no reply): for a name the server listed in its hello,
the client chooses the function's id and sends the lookup with its next request; any other name
is asked for at once, and an unknown one raises at ``get_function`` as before. Against real
servers, and the client's channel against a socket whose far end the test reads."""
import gc
import socket

import pytest

import kernelrpc
from kernelrpc import rpc
from kernelrpc.errors import ProtocolError
from kernelrpc.wire import protocol as P
from kernelrpc.wire.hello import HelloReplyParser, MAX_GLOBALS_LISTED, encode_hello_accept
from kernelrpc.rpc.channel import Channel
from kernelrpc.wire.requests import CLIENT_IDS_FIRST, MAX_NAME_BYTES, GlobalAt, ListGlobals, Op
from kernelrpc.wire.values import DeviceValue, FunctionHandle
from test_client_allocate import assert_ends_the_session, frames_sent, send_and_read_reply
from test_client_api import server, session  # noqa: F401 (the client tests' server)


def channel_with(info: dict):
    ours, peer = socket.socketpair()
    return Channel(ours, HelloReplyParser().feed(encode_hello_accept(info)).info, "test"), ours, peer


@pytest.fixture
def channel():
    ch, ours, peer = channel_with({"max_client_tensors": 2, "globals": ["testing.echo", "runtime.device_info"]})
    yield ch, peer
    ours.close()
    peer.close()


def test_a_listed_name_is_looked_up_with_the_next_request_in_order_with_the_frees(channel):
    ch, peer = channel
    first = ch.global_at("testing.echo")
    assert first == FunctionHandle(CLIENT_IDS_FIRST) and frames_sent(peer) == []    # nothing sent yet
    assert ch.global_at("not.listed") is None                      # asked for by a GET_GLOBAL instead
    ch.release(first)
    second = ch.global_at("runtime.device_info")
    third = ch.global_at("testing.echo")
    assert ch.global_at("testing.echo") is None                    # max_client_tensors: two at a time
    peer.sendall(P.encode_return([[]]))
    assert ch.request(ListGlobals()) == [[]]
    assert frames_sent(peer) == [(Op.GLOBAL_AT, ["testing.echo", first]), (Op.RELEASE, [first.id]),
                                 (Op.GLOBAL_AT, ["runtime.device_info", second]),
                                 (Op.GLOBAL_AT, ["testing.echo", third]), (Op.LIST_GLOBALS, [])]
    assert ch.account.client_tensors == 2 and ch.account.tensor_bytes == 0
    ch.release(second)
    ch.release(third)
    peer.sendall(P.encode_return([[]]))
    ch.request(ListGlobals())
    assert frames_sent(peer) == [(Op.RELEASE, [second.id, third.id]), (Op.LIST_GLOBALS, [])]
    assert ch.account.client_tensors == 0


def test_lookups_and_allocations_share_the_ids_and_the_bound():
    ch, ours, peer = channel_with({"max_client_tensors": 2, "max_session_bytes": 100, "globals": ["testing.echo"]})
    with ours, peer:
        tensor = ch.allocate("float32", (1,), DeviceValue("cpu", 0), 4)
        function = ch.global_at("testing.echo")
        assert (tensor.id, function.id) == (CLIENT_IDS_FIRST, CLIENT_IDS_FIRST + 1)
        assert ch.global_at("testing.echo") is None and ch.account.client_tensors == 2


@pytest.mark.parametrize("info", [
    {"max_client_tensors": 2},                                              # an older server: no names
    {"max_client_tensors": 0, "globals": ["testing.echo"]},                 # no ids of the client's
    {"max_client_tensors": 2, "globals": ["testing.echo"], "ops": [16, 17, 19, 20]},   # no GLOBAL_AT
])
def test_a_server_that_cannot_take_it_gets_a_get_global(info):
    checked = HelloReplyParser().feed(encode_hello_accept(info)).info
    checked["ops"] = info.get("ops", checked["ops"])     # what a server without GLOBAL_AT lists
    ours, peer = socket.socketpair()
    with ours, peer:
        assert Channel(ours, checked, "test").global_at("testing.echo") is None


@pytest.mark.parametrize("names", ["testing.echo", [1], ["x" * (MAX_NAME_BYTES + 1)],
                                   ["f"] * (MAX_GLOBALS_LISTED + 1)])
def test_the_hello_lists_the_globals_within_bounds(names):
    with pytest.raises(ProtocolError, match="globals is not a list"):
        HelloReplyParser().feed(encode_hello_accept({"globals": names}))


def test_get_function_is_pipelined_and_unknown_names_raise_at_once(session):
    assert set(session.info["globals"]) >= {"testing.echo", "runtime.device_info"}
    echo = session.get_function("testing.echo")
    assert echo._handle.id >= CLIENT_IDS_FIRST and session.channel.connection.queued   # queued, not sent
    assert echo(5) == 5 and echo("text") == "text"
    with pytest.raises(kernelrpc.RemoteError, match="no global function 'no.such.function'"):
        session.get_function("no.such.function")
    live = session.get_function("session.live_handles")     # the session's own: asked for, not listed
    assert live._handle.id < CLIENT_IDS_FIRST
    before = live()
    for _ in range(1000):                                   # more than the queue holds: sent on the way
        session.get_function("testing.echo")
    gc.collect()
    assert live() == before                                 # every lookup released
    functions = [session.get_function("runtime.device_info") for _ in range(3)]
    assert live() == before + 3 and all(f().startswith("{") for f in functions)


def test_a_session_that_ended_is_heard_at_the_next_request(start_service):
    server = start_service("kernelrpc.server", ["--port", "0"])
    sess = rpc.connect(server.host, server.port)
    sess.close()
    with pytest.raises(kernelrpc.ConnectionLost):
        sess.get_function("testing.echo")                   # closed: asked for, and refused at once


@pytest.mark.parametrize("values, message", [
    (["testing.echo", FunctionHandle(7)], "GLOBAL_AT: id 7 is outside the ids a client may choose"),
    (["no.such.function", FunctionHandle(CLIENT_IDS_FIRST)], "no global function 'no.such.function'"),
    (["testing.echo", CLIENT_IDS_FIRST], "GLOBAL_AT: function must be FunctionHandle"),
])
def test_a_bad_global_at_ends_the_session_with_a_protocol_error(server, values, message):
    assert_ends_the_session(server, P.encode_request(P.GLOBAL_AT, values),
                            f"GLOBAL_AT refused, the session ends: .*{message}")


def test_an_id_in_use_or_past_the_bound_ends_the_session(server):
    with rpc.connect(server.host, server.port) as sess:
        echo = sess.get_function("testing.echo")
        assert echo(1) == 1
        with pytest.raises(kernelrpc.RemoteError, match=f"GLOBAL_AT: id {echo._handle.id} is in use"):
            send_and_read_reply(sess, P.encode(GlobalAt("testing.echo", echo._handle)))
    with rpc.connect(server.host, server.port) as sess:
        bound = sess.info["max_client_tensors"]
        frames = b"".join(P.encode(GlobalAt("testing.echo", FunctionHandle(CLIENT_IDS_FIRST + k)))
                          for k in range(bound + 1))
        with pytest.raises(kernelrpc.RemoteError, match="max_client_tensors"):
            send_and_read_reply(sess, frames)
