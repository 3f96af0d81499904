"""The fast paths agree with the general codec they mirror, on every input.

``encode_call``/``decode_call``/``encode_result``/``decode_result`` (with their one-pack scalar
cases), the session connections' ``call_from_read``/``result_from_read`` (a whole frame straight
from one read; tests/test_session_connection.py has their kept calls) and
``FrameReader.whole_frame`` exist for speed (docs/performance.md), as do the decoder's memo of
tensor handles and of lists, a handle's kept encoding, and each side's conversion of a call's
arguments (``HandleTable.all_from_wire``, ``RPCSession.all_to_wire``); these differential tests
pin each of them to the general path.
"""
import math
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol import handles, values

from kernelrpc.errors import ProtocolError
from kernelrpc.wire import protocol as P
from kernelrpc.wire.connection import NOT_ONE_FRAME, ClientConnection, ServerConnection, SessionAccount
from kernelrpc.wire.hello import _checked_info
from kernelrpc.wire.convert import Converter
from kernelrpc.wire.requests import Call, from_values
from kernelrpc.wire import values as values_module
from kernelrpc.wire.values import (DeviceValue, FunctionHandle, TensorHandle, decode_single, decode_values,
                                   encode_values)

MAX_FRAME = 4096
SERVER = ServerConnection(MAX_FRAME, SessionAccount(0, 0, 0))
CLIENT = ClientConnection({"max_frame_bytes": MAX_FRAME, "max_tensor_bytes": 0, "max_session_bytes": 0,
                           "max_client_tensors": 0, "globals": []})
ints = st.integers(-2**63, 2**63 - 1)
edge_ints = st.sampled_from([0, 1, -1, 2**31, -2**31, 2**32, 2**63 - 1, -2**63])
floats = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, 5e-324])
scalar_args = st.lists(ints | edge_ints | floats, max_size=6)


def outcome(decode, data: bytes):
    try:
        got = decode(data)
    except ProtocolError:
        return ProtocolError
    if type(got) in (Call, tuple):  # call_from_read's (function_id, args) pair, decode_call's Call;
        got = (got[0], list(got[1]))  # the one-unpack path gives a tuple of arguments, the general one a list
    return repr(got)  # repr: NaN equals NaN, and -0.0 differs from 0.0


def general_call(body: bytes):
    """What the general request decoder makes of a REQUEST body."""
    return from_values(body[0], decode_values(body, 1)) if body else P.decode_request(body)


@given(handles, scalar_args | st.lists(values, max_size=4))
def test_call_encoder_matches_the_general_encoding(function_id, args):
    request = P.encode_call(function_id, args)
    assert request == P.encode_request(P.CALL, [FunctionHandle(function_id), *args])
    assert request == P.encode(Call(function_id, tuple(args)))
    decoded = P.decode_request(request[P.HEADER_SIZE:])
    assert type(decoded) is Call and decoded.function_id == function_id
    assert repr(list(decoded.args)) == repr(list(args))


def test_nan_and_subclasses_encode_as_the_general_codec_does():
    class Level(IntEnum):
        HIGH = 3

    for args in ([math.nan], [True], [False], [Level.HIGH], [None], [1, math.nan, 2]):
        assert P.encode_call(7, args) == P.encode_request(P.CALL, [FunctionHandle(7), *args])
    for value in (math.nan, True, Level.HIGH, None):
        assert P.encode_result(value) == P.encode_return([value])
    assert math.isnan(P.decode_result(P.encode_result(math.nan)[P.HEADER_SIZE:]))
    assert P.decode_result(P.encode_result(True)[P.HEADER_SIZE:]) is True


@pytest.mark.parametrize("value", [2**63, -2**63 - 1, 2**64])
def test_out_of_range_ints_are_refused_by_the_call_codec(value):
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_call(1, [value])
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_call(1, [1, value])
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_result(value)


@given(values | ints | floats | edge_ints)
def test_results_round_trip_and_match_the_general_encoding(value):
    reply = P.encode_result(value)
    assert reply == P.encode_return([value])
    assert repr(P.decode_result(reply[P.HEADER_SIZE:])) == repr(value)


@st.composite
def damaged_frames(draw):
    """Valid CALL or RETURN frames with one byte changed, cut short or extended."""
    if draw(st.booleans()):
        frame = bytearray(P.encode_call(draw(handles), draw(scalar_args | st.lists(values, max_size=3))))
    else:
        frame = bytearray(P.encode_result(draw(values | ints | floats)))
    how = draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        pos = draw(st.integers(0, len(frame) - 1))
        frame[pos] ^= draw(st.integers(1, 255))
    elif how == "cut":
        frame = frame[:draw(st.integers(0, len(frame) - 1))]
    else:
        frame += draw(st.binary(min_size=1, max_size=9))
    return bytes(frame)


def general_whole_frame(data: bytes):
    """The one frame the general reader finds in ``data``, or None (partial, several, bad)."""
    reader = P.FrameReader(MAX_FRAME)
    try:
        reader.feed(data)
        frame = reader.next_frame()
    except ProtocolError:
        return None
    return None if reader.pending else frame


def check_agrees(data: bytes) -> None:
    body = data[P.HEADER_SIZE:]
    if body and body[0] == P.CALL:
        assert outcome(P.decode_call, body) == outcome(general_call, body)
    assert outcome(P.decode_result, body) == outcome(decode_single, body)
    general_frame = general_whole_frame(data)
    fast_call = outcome(SERVER.call_from_read, data)
    if fast_call == repr(None):  # left to the general path: then it is not one valid CALL frame
        assert general_frame is None or general_frame[0] != P.REQUEST or general_frame[1][:1] != bytes([P.CALL]) \
            or outcome(P.decode_call, general_frame[1]) is ProtocolError
    else:
        assert general_frame is not None and fast_call == outcome(P.decode_call, general_frame[1])
    fast_result = outcome(CLIENT.result_from_read, data)
    if fast_result == repr(NOT_ONE_FRAME):
        assert general_frame is None or general_frame[0] != P.RETURN
    else:
        assert general_frame is not None and fast_result == outcome(P.decode_result, general_frame[1])
        assert fast_result == outcome(lambda _: CLIENT.result_of(general_frame), data)  # the general lane
    reader = P.FrameReader(MAX_FRAME)
    whole = reader.whole_frame(data)
    try:
        reader.feed(data)
        general = reader.next_frame()
        if reader.pending:
            general = None  # more than one frame: not the one-read case
    except ProtocolError:
        general = None
    assert whole == general


@settings(max_examples=500)
@given(damaged_frames() | st.binary(max_size=120))
def test_damaged_frames_are_judged_as_the_general_path_judges_them(data):
    check_agrees(data)


def test_whole_frame_leaves_everything_but_one_frame_to_the_reader():
    call = P.encode_call(3, [1])
    reader = P.FrameReader(MAX_FRAME)
    assert reader.whole_frame(call) == (P.REQUEST, call[P.HEADER_SIZE:])
    for data in (call[:-1], call + call, call + b"\0", b"", call[:4], P.encode_call(3, ["x" * MAX_FRAME])):
        assert reader.whole_frame(data) is None


def test_the_one_read_decoders_leave_everything_but_one_frame_to_the_general_path():
    call, result = P.encode_call(3, [1]), P.encode_result(1)
    assert SERVER.call_from_read(call) == (3, (1,))
    assert CLIENT.result_from_read(result) == 1
    for data in (call[:-1], call + call, call + b"\0", result, b"", call[:4],
                 P.encode_request(P.FREE, [FunctionHandle(3)])):
        assert SERVER.call_from_read(data) is None
    for data in (result[:-1], result + result, result + b"\0", call, P.encode_error("E", "m"), b""):
        assert CLIENT.result_from_read(data) is NOT_ONE_FRAME
    with pytest.raises(ProtocolError):
        SERVER.call_from_read(P.encode_request(P.CALL, [1, 1]))


@given(handles, scalar_args | st.lists(values, max_size=4))
def test_call_encoder_converts_with_to_wire_unless_the_call_is_one_scalar(function_id, args):
    seen = []

    def to_wire(given_args):
        seen.append(given_args)
        return list(given_args)

    assert P.encode_call(function_id, args, None, to_wire) == P.encode_call(function_id, list(args))
    one_scalar = len(args) == 1 and (type(args[0]) is float or type(args[0]) is int and -2**63 <= args[0] < 2**63)
    assert seen == ([] if one_scalar else [args])


def test_call_encoder_refuses_a_frame_over_the_limit_and_names_it():
    body = len(P.encode_call(3, ["x" * 100])) - P.HEADER_SIZE
    assert P.encode_call(3, ["x" * 100], body) == P.encode_call(3, ["x" * 100])
    with pytest.raises(ValueError, match=f"frame limit of {body - 1} bytes"):
        P.encode_call(3, ["x" * 100], body - 1)
    assert P.encode_call(3, [1], P.MIN_MAX_FRAME_BYTES) == P.encode_call(3, [1])


def decoded_cold(decode, data: bytes):
    """``outcome`` with the memos of tensor handles and of lists empty: what the full decode makes
    of ``data``."""
    values_module._HANDLES.clear()
    values_module._LISTS.clear()
    return outcome(decode, data)


tensor_handles = st.builds(TensorHandle, handles, st.sampled_from(["float32", "int8"]),
                           st.lists(st.integers(0, 9), max_size=3).map(tuple), st.just(DeviceValue("cpu")))


@settings(max_examples=300)
@given(st.lists(values, max_size=4) | st.tuples(tensor_handles, st.lists(values, max_size=3)).map(
    lambda first_rest: [first_rest[0], *first_rest[1]]), st.data())
def test_memoized_tensor_handles_decode_as_the_full_decode(items, data):
    encoded = encode_values(items)
    cold = decoded_cold(decode_values, encoded)
    assert outcome(decode_values, encoded) == cold == repr(items)  # the second decode hits the memo
    damaged = bytearray(encoded)
    how = data.draw(st.sampled_from(["flip", "cut"]))
    if how == "flip" and damaged:
        damaged[data.draw(st.integers(0, len(damaged) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        damaged = damaged[:data.draw(st.integers(0, max(len(damaged) - 1, 0)))]
    decode_values(encoded)  # the memo holds this message's handles
    warm = outcome(decode_values, bytes(damaged))
    assert warm == decoded_cold(decode_values, bytes(damaged))


def test_a_memoized_handle_is_equal_to_its_full_decode_and_the_memo_is_bounded():
    handle = TensorHandle(5, "float32", (2, 3), DeviceValue("cpu", 1))
    encoded = encode_values([handle])
    values_module._HANDLES.clear()
    (first,) = decode_values(encoded)
    (again,) = decode_values(encoded)
    assert first == again == handle and first.wire == encoded[4:]
    assert values_module.decode_items(bytearray(encoded), 4, 1) == [handle]  # any buffer, as before
    for i in range(values_module._MAX_HANDLES_MEMO + 10):
        decode_values(encode_values([TensorHandle(i, "int8", (1,), DeviceValue("cpu"))]))
    assert len(values_module._HANDLES) <= values_module._MAX_HANDLES_MEMO


def test_a_memoized_list_is_a_new_list_of_the_full_decodes_values_and_the_memo_is_bounded():
    handle = TensorHandle(5, "float32", (2,), DeviceValue("cpu"))
    encoded = encode_values([handle, 3, "x"])
    values_module._LISTS.clear()
    first = decode_values(encoded)
    again = decode_values(encoded)
    assert first == again == [handle, 3, "x"] and again is not first
    again.append(4)  # the caller's own list: the memo is not changed
    assert decode_values(encoded) == [handle, 3, "x"]
    assert decode_values(encode_values([handle, [1]])) == [handle, [1]]
    assert encode_values([handle, [1]])[4:] not in values_module._LISTS  # a list value is mutable
    with pytest.raises(ProtocolError, match="unexpected bytes"):  # the same bytes under another count
        values_module.decode_items(encoded, 4, 2)
    for i in range(values_module._MAX_LISTS_MEMO + 10):
        decode_values(encode_values([TensorHandle(i, "int8", (1,), DeviceValue("cpu"))]))
    assert len(values_module._LISTS) <= values_module._MAX_LISTS_MEMO


def test_a_tensor_handles_kept_encoding_is_what_a_fresh_handle_encodes():
    handle = TensorHandle(9, "int32", (2, 5), DeviceValue("cpu", 3))
    first = encode_values([handle, 1])
    assert handle.wire is not None  # kept by the first encoding: the second appends it as it is
    assert encode_values([handle, 1]) == first == encode_values([TensorHandle(9, "int32", (2, 5),
                                                                              DeviceValue("cpu", 3)), 1])


def converted(convert, values):
    """What ``convert`` makes of ``values``: the list, or the type and message of its error."""
    try:
        return list(convert(values))
    except Exception as exc:  # noqa: BLE001 - compared, not hidden
        return type(exc), str(exc)


def same_conversion(fast, general) -> None:
    assert type(fast) is type(general)
    if type(fast) is tuple:  # an error
        assert fast == general
        return
    assert len(fast) == len(general)
    for got, want in zip(fast, general):
        assert got is want or repr(got) == repr(want)


@settings(max_examples=300)
@given(st.data())
def test_the_handle_tables_conversion_of_a_call_is_the_general_conversion(data):
    from kernelrpc import runtime
    from kernelrpc.server.handler import HandleTable

    table = HandleTable()
    live = [table.put(runtime.Tensor((1 + i,), "float32")) for i in range(3)]
    function_id = table.put(lambda *args: None)
    freed = table.put(runtime.Tensor((2,), "int8"))
    del table.objects[freed]
    ids = st.sampled_from([*live, function_id, freed, 10**6])
    argument = (st.builds(TensorHandle, ids, st.just("float32"), st.just((1,)), st.just(DeviceValue("cpu")))
                | st.builds(FunctionHandle, ids) | st.integers() | st.floats() | st.text(max_size=3)
                | st.none() | st.booleans() | st.just(DeviceValue("cpu", 1)))
    args = data.draw(st.lists(argument | st.lists(argument, max_size=2), max_size=5))
    general = converted(lambda values: [Converter.from_wire(table, v) for v in values], args)
    same_conversion(converted(table.all_from_wire, args), general)
    same_conversion(converted(lambda values: [table.from_wire(v) for v in values], args), general)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_sessions_conversion_of_a_call_is_the_general_conversion(data):
    import socket

    import numpy as np

    from kernelrpc.rpc.client import RPCSession
    from kernelrpc.rpc.remote import Tensor as RemoteTensor
    from kernelrpc.wire.requests import OPTIONAL_OPS

    info = _checked_info({"ops": sorted(int(op) for op in OPTIONAL_OPS)})
    pairs = [socket.socketpair() for _ in range(2)]
    try:  # conversion never touches the socket: these sessions send nothing
        session, other = (RPCSession(mine, dict(info), "test") for mine, _ in pairs)
        device = DeviceValue("cpu")
        ours = [RemoteTensor(session, TensorHandle(i, "float32", (1,), device)) for i in range(2)]
        theirs = RemoteTensor(other, TensorHandle(7, "float32", (1,), device))
        freed = RemoteTensor(session, TensorHandle(8, "float32", (1,), device))
        freed._session = None  # as free() leaves it
        argument = (st.sampled_from([*ours, theirs, freed, np.float32(2.5), np.arange(3, dtype="int16"),
                                     session.cpu(0)])
                    | st.integers() | st.floats() | st.text(max_size=3) | st.none() | st.booleans())
        args = tuple(data.draw(st.lists(argument | st.lists(argument, max_size=2), max_size=5)))
        general = converted(lambda values: [Converter.to_wire(session, v) for v in values], args)
        same_conversion(converted(session.all_to_wire, args), general)
        same_conversion(converted(lambda values: [session.to_wire(v) for v in values], args), general)
    finally:
        for mine, peer in pairs:
            mine.close()
            peer.close()
