"""The session connections (wire/connection.py): each fast lane pinned to the general path beside it.

* ``ServerConnection.call_from_read`` (one whole CALL frame straight from one read) against
  ``feed`` + ``next_frame`` + ``request_of``, with a kept call (``keep_call``): the same frame
  again is the kept RepeatedCall on both lanes, whose arguments are what decoding it gives; any
  other bytes decode as before (tests/test_protocol_fastpath.py judges damaged frames without one);
* ``ClientConnection.take_queued``'s frees-only shortcut against its general loop, and what it
  sends against the order the client queued it in, with the account as the server counts it;
* the client's ``SessionAccount`` against the server's, driven by the same requests.
"""
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol_fastpath import MAX_FRAME, general_whole_frame

from kernelrpc.errors import ProtocolError
from kernelrpc.server.config import ServerConfig
from kernelrpc.server.handler import SessionHandler
from kernelrpc.wire import protocol as P
from kernelrpc.wire.connection import (MAX_KEPT_CALLS, ClientConnection, RepeatedCall, ServerConnection,
                                       SessionAccount)
from kernelrpc.wire.requests import CLIENT_IDS_FIRST as FIRST
from kernelrpc.wire.requests import OP_OF, OPTIONAL_OPS, Allocate, Free, GlobalAt, Release
from kernelrpc.wire.values import DeviceValue, FunctionHandle, TensorHandle

CPU = DeviceValue("cpu", 0)
tensor_handles = st.builds(lambda i, n: TensorHandle(i, "float32", (n,), CPU),
                           st.integers(1, 2**40), st.integers(0, 64))


def server() -> ServerConnection:
    return ServerConnection(MAX_FRAME, SessionAccount(1 << 20, 1 << 20, 8))


def client(**info) -> ClientConnection:
    return ClientConnection({"max_frame_bytes": MAX_FRAME, "max_tensor_bytes": 1000, "max_session_bytes": 4000,
                             "max_client_tensors": 4, "globals": ["testing.echo"],
                             "ops": sorted(int(op) for op in OPTIONAL_OPS), **info})


def general(conn: ServerConnection, data: bytes):
    """What the general path makes of ``data`` if it is one whole REQUEST frame, else None."""
    frame = general_whole_frame(data)
    if frame is None or frame.type != P.REQUEST or frame.body[:1] != bytes([P.CALL]):
        return None
    try:
        return conn.request_of(frame.body)
    except ProtocolError:
        return ProtocolError


def fast(conn: ServerConnection, data: bytes):
    try:
        return conn.call_from_read(data)
    except ProtocolError:
        return ProtocolError


def same(a, b) -> bool:
    if type(a) is RepeatedCall or type(b) is RepeatedCall:
        return a is b
    if a is ProtocolError or b is ProtocolError:
        return a is b
    return (a[0], list(a[1])) == (b[0], list(b[1]))


@settings(max_examples=300)
@given(st.integers(0, 2**64 - 1), st.lists(tensor_handles, min_size=1, max_size=4), st.data())
def test_a_kept_call_is_repeated_on_both_lanes_and_nothing_else_is(function_id, args, data):
    conn = server()
    frame = P.encode_call(function_id, args)
    decoded = conn.call_from_read(frame)
    assert decoded == (function_id, args)
    conn.keep_call(function_id, decoded[1], "prepared")
    for lane in (fast, general):
        repeated = lane(conn, frame)
        assert type(repeated) is RepeatedCall and repeated is conn.kept[function_id]
        assert repeated.args == P.decode_call(frame[P.HEADER_SIZE:]).args and repeated.prepared == "prepared"
    other = bytearray(frame)
    pos = data.draw(st.integers(0, len(frame) - 1))
    other[pos] ^= data.draw(st.integers(1, 255))
    other = bytes(other)
    got, expected = fast(conn, other), general(conn, other)
    if got is None:
        assert expected is None or expected is ProtocolError
    else:
        assert same(got, expected)
        assert type(got) is not RepeatedCall


def test_forget_drops_the_kept_calls_of_a_function_and_the_prepared_ones_of_a_tensor():
    conn = server()
    a, b = TensorHandle(5, "float32", (1,), CPU), TensorHandle(6, "float32", (1,), CPU)
    for function_id, args, prepared in ((1, [a], None), (2, [a, b], "p"), (3, [b], "q")):
        conn.call_from_read(P.encode_call(function_id, args))
        conn.keep_call(function_id, args, prepared)
    assert conn.kept_ids == {1, 2, 3, 5, 6}
    conn.forget(5)
    assert set(conn.kept) == {3} and conn.kept_ids == {3, 6}
    conn.forget(3)
    assert conn.kept == {} and conn.kept_ids == set()
    frame = P.encode_call(3, [b])
    assert conn.call_from_read(frame) == (3, [b])     # decoded again, not repeated


def test_the_kept_calls_are_bounded():
    conn = server()
    handle = TensorHandle(5, "float32", (1,), CPU)
    for function_id in range(MAX_KEPT_CALLS + 1):
        conn.call_from_read(P.encode_call(function_id, [handle]))
        conn.keep_call(function_id, [handle])
    assert len(conn.kept) <= MAX_KEPT_CALLS


queue_steps = st.lists(st.one_of(st.tuples(st.just("release"), st.integers(1, 50)),
                                 st.tuples(st.just("allocate"), st.integers(0, 1200)),
                                 st.just(("global_at",))), max_size=30)


def sent(data: bytes) -> list:
    reader, out = P.FrameReader(), []
    reader.feed(data)
    while (frame := reader.next_frame()) is not None:
        out.append(P.decode_request(frame.body))
    return out


@given(queue_steps)
def test_the_queue_goes_out_in_order_and_counted_as_the_server_counts(steps):
    conn, expected, model = client(), [], {}
    for step in steps:
        if step[0] == "release":
            handle = FunctionHandle(step[1] if not model else min(model))
            conn.release(handle)
            expected.append(handle.id)
            model.pop(handle.id, None)
        elif step[0] == "allocate":
            handle = conn.allocate("int8", (step[1],), CPU, step[1])
            fits = (step[1] <= 1000 and len(model) < 4 and sum(model.values()) + step[1] <= 4000)
            assert (handle is not None) == fits
            if handle is not None:
                expected.append(Allocate(handle))
                model[handle.id] = step[1]
        else:
            handle = conn.global_at("testing.echo")
            assert (handle is not None) == (len(model) < 4)
            if handle is not None:
                expected.append(GlobalAt("testing.echo", handle))
                model[handle.id] = 0
    ahead, answered = conn.take_queued()
    assert not answered and conn.queued == []
    got = []
    for request in sent(ahead):
        got.extend(request.ids if type(request) is Release else [request])
    assert got == expected
    assert conn.account.tensor_bytes == sum(model.values()) and conn.account.client_tensors == len(model)


@given(st.lists(st.integers(1, 2**40), min_size=1, max_size=20))
def test_the_frees_only_shortcut_sends_what_the_general_loop_sends(ids):
    shortcut = client(max_client_tensors=0)     # nothing pipelined: only frees are ever queued
    loop = client()
    assert not shortcut.allocate_op and not shortcut.globals and loop.allocate_op
    for conn in (shortcut, loop):
        for handle_id in ids:
            conn.release(FunctionHandle(handle_id))
    assert shortcut.take_queued() == loop.take_queued()


def test_a_server_without_release_gets_a_free_that_is_answered():
    conn = client(ops=[])
    conn.release(FunctionHandle(7))
    ahead, answered = conn.take_queued()
    assert answered and sent(ahead) == [Free((FunctionHandle(7),))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("allocate"), st.integers(0, 1200)),
                          st.tuples(st.just("free"), st.integers(0, 10)),
                          st.just(("global_at",))), max_size=20))
def test_the_client_counts_what_the_server_counts(steps):
    """The client's account, driven by its own queue, and the server's, by the requests the
    queue sends: the same bytes and entries after every step."""
    conn = client()
    handler = SessionHandler(None, None, ServerConfig(max_tensor_bytes=1000, max_session_bytes=4000,
                                                      max_client_tensors=4))
    live = []
    for step in steps:
        if step[0] == "allocate":
            handle = conn.allocate("int8", (step[1],), CPU, step[1])
        elif step[0] == "global_at":
            handle = conn.global_at("testing.echo")
        else:
            handle = None
            if live:
                conn.release(live.pop(step[1] % len(live)))
        if handle is not None:
            live.append(handle)
        ahead, _ = conn.take_queued()
        for request in sent(ahead):
            handler._handlers[int(OP_OF[type(request)])](request)
        assert (conn.account.tensor_bytes, conn.account.client_tensors) == \
            (handler.account.tensor_bytes, handler.account.client_tensors)
    handler._drop(list(handler._objects))


def test_keeping_a_repeated_call_again_keeps_its_own_frame():
    """A prepared call that cannot run (its tensor freed outside the table) is prepared again and
    kept anew: with its own frame, not the last one decoded for another function."""
    conn = server()
    a = TensorHandle(5, "float32", (1,), CPU)
    first, other = P.encode_call(1, [a]), P.encode_call(2, [a, a])
    conn.keep_call(*conn.call_from_read(first))
    conn.call_from_read(other)                           # another function's call in between
    for lane in (fast, general):
        repeated = lane(conn, first)
        assert type(repeated) is RepeatedCall
        conn.keep_call(1, repeated.args, "prepared again")
        assert conn.kept[1].frame == first and lane(conn, first) is conn.kept[1]


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 4), st.integers(0, 60), st.integers(0, 5))
def test_the_clients_admit_is_the_two_refusals(max_tensor, max_session, max_entries, nbytes, entries):
    """SessionAccount.admit (the client's fast lane) admits exactly what neither bytes_refused
    nor entry_refused refuses, and then counts as add does."""
    fast, general = (SessionAccount(max_tensor, max_session, max_entries) for _ in range(2))
    for i in range(entries):
        for account in (fast, general):
            account.add(FIRST + 100 + i, 1)
    expected = general.bytes_refused(nbytes) is None and general.entry_refused() is None
    assert fast.admit(FIRST, nbytes) == expected
    if expected:
        general.add(FIRST, nbytes)
    assert (fast.tensor_bytes, fast.client_tensors) == (general.tensor_bytes, general.client_tensors)
