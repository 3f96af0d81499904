"""The CALL/RETURN fast paths agree with the general frame codec, on every input."""
import math
import struct
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol import handles, values

from kernelrpc.errors import ProtocolError
from kernelrpc.rpc import protocol as P
from kernelrpc.rpc.values import FunctionHandle

MAX_FRAME = 4096
ints = st.integers(-2**63, 2**63 - 1)
edge_ints = st.sampled_from([0, 1, -1, 2**31, -2**31, 2**32, 2**63 - 1, -2**63])
floats = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, 5e-324])
scalar_args = st.lists(ints | edge_ints | floats, max_size=6)


def general_call(data: bytes):
    """What the general path makes of ``data`` when it is exactly one whole CALL frame."""
    reader = P.FrameReader(MAX_FRAME)
    reader.feed(data)
    frame = reader.next_frame()
    if frame is None or reader.pending or frame.type != P.REQUEST or not frame.body or frame.body[0] != P.CALL:
        return "not one CALL frame"
    return P.decode_call(frame.body)


def general_result(data: bytes):
    """What the general path makes of ``data`` when it is exactly one whole RETURN frame."""
    reader = P.FrameReader(MAX_FRAME)
    reader.feed(data)
    frame = reader.next_frame()
    if frame is None or reader.pending or frame.type != P.RETURN:
        return "not one RETURN frame"
    return P.decode_result(frame.body)


def outcome(decode, data: bytes):
    try:
        return decode(data)
    except ProtocolError:
        return ProtocolError


def check_call_frame_agrees(data: bytes) -> None:
    fast = outcome(lambda d: P.decode_call_frame(d, MAX_FRAME), data)
    general = outcome(general_call, data)
    if fast is None:  # left to the general path, which must then not find a valid CALL there
        assert general in ("not one CALL frame", ProtocolError)
    elif fast is ProtocolError:
        assert general is ProtocolError
    else:
        assert repr((fast[0], list(fast[1]))) == repr(general)  # repr: NaN equals NaN, and -0.0 differs from 0.0


def check_result_frame_agrees(data: bytes) -> None:
    fast = outcome(lambda d: P.decode_result_frame(d, MAX_FRAME), data)
    general = outcome(general_result, data)
    if fast is P.NOT_ONE_FRAME:  # left to the general path, which must then not find a valid RETURN there
        assert general in ("not one RETURN frame", ProtocolError)
    else:
        assert repr(fast) == repr(general)


@given(handles, scalar_args)
def test_scalar_calls_round_trip_and_match_the_general_encoding(function_id, args):
    request = P.encode_call(function_id, args)
    assert request == P.encode_request(P.CALL, [FunctionHandle(function_id), *args])
    decoded_id, decoded = P.decode_call_frame(request, MAX_FRAME)
    assert decoded_id == function_id and repr(list(decoded)) == repr(args)  # -0.0 stays -0.0


@given(handles, st.lists(values | ints | floats, max_size=3))
def test_scalar_call_encoder_takes_no_or_one_exact_int_or_float(function_id, args):
    request = P.encode_scalar_call(function_id, args)
    if len(args) == 0 or (len(args) == 1 and type(args[0]) in (int, float)):
        assert request == P.encode_request(P.CALL, [FunctionHandle(function_id), *args])
    else:
        assert request is None


def test_scalar_call_encoder_declines_subclasses_and_out_of_range_ints():
    class Level(IntEnum):
        HIGH = 3

    for args in ([True], [Level.HIGH], [2**63], [-2**63 - 1], [1, 2], ["1"]):
        assert P.encode_scalar_call(1, args) is None


@given(handles, st.lists(values, max_size=4))
def test_any_call_round_trips_through_the_frame_fast_path(function_id, args):
    decoded_id, decoded = P.decode_call_frame(P.encode_call(function_id, args), MAX_FRAME << 10)
    assert decoded_id == function_id and list(decoded) == args


@given(values | ints | floats)
def test_results_round_trip_and_match_the_general_encoding(value):
    reply = P.encode_result(value)
    assert reply == P.encode_return([value])
    assert P.decode_result_frame(reply, MAX_FRAME << 10) == value
    scalar = P.encode_scalar_result(value)
    assert scalar == (reply if type(value) in (int, float) else None)


def test_nan_and_subclasses_encode_as_the_general_codec_does():
    class Level(IntEnum):
        HIGH = 3

    for args in ([math.nan], [True], [False], [Level.HIGH], [None], [1, math.nan, 2]):
        assert P.encode_call(7, args) == P.encode_request(P.CALL, [FunctionHandle(7), *args])
    for value in (math.nan, True, Level.HIGH, None):
        assert P.encode_result(value) == P.encode_return([value])
    assert P.encode_scalar_result(math.nan) == P.encode_result(math.nan)
    for value in (True, Level.HIGH, None, 2**63, "1"):
        assert P.encode_scalar_result(value) is None
    assert math.isnan(P.decode_result_frame(P.encode_result(math.nan), MAX_FRAME))
    assert P.decode_result_frame(P.encode_result(True), MAX_FRAME) is True


@pytest.mark.parametrize("value", [2**63, -2**63 - 1, 2**64])
def test_out_of_range_ints_are_refused_by_the_fast_encoders(value):
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_call(1, [value])
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_call(1, [1, value])
    with pytest.raises(ProtocolError, match="64 bits"):
        P.encode_result(value)


def test_frames_the_fast_paths_leave_to_the_general_path():
    call = P.encode_call(3, [1])
    result = P.encode_result(1)
    for data in (call[:-1], call + call, call + b"\0", P.encode_request(P.FREE, [FunctionHandle(3)]),
                 result, b"", call[:4]):
        assert P.decode_call_frame(data, MAX_FRAME) is None
    assert P.decode_call_frame(P.encode_call(3, ["x" * MAX_FRAME]), MAX_FRAME) is None  # over the limit
    for data in (result[:-1], result + result, result + b"\0", call, P.encode_error("E", "m"), b"", result[:4]):
        assert P.decode_result_frame(data, MAX_FRAME) is P.NOT_ONE_FRAME
    assert P.decode_result_frame(P.encode_result("x" * MAX_FRAME), MAX_FRAME) is P.NOT_ONE_FRAME


def test_whole_but_malformed_frames_are_protocol_errors():
    truncated_arg = P.encode_call(3, [1])[:-1]
    truncated_arg = struct.pack("<IB", len(truncated_arg) - 5, P.REQUEST) + truncated_arg[5:]
    for data in (P.encode_request(P.CALL, [1, 1]), truncated_arg):
        with pytest.raises(ProtocolError):
            P.decode_call_frame(data, MAX_FRAME)
    too_short = P.encode_request(P.CALL)  # no function handle: shorter than any CALL the fast path takes
    assert P.decode_call_frame(too_short, MAX_FRAME) is None
    with pytest.raises(ProtocolError):
        general_call(too_short)
    for values_ in ([], [1, 2]):
        with pytest.raises(ProtocolError):
            P.decode_result_frame(P.encode_return(values_), MAX_FRAME)
    with pytest.raises(ProtocolError):
        P.decode_result_frame(P.encode_frame(P.RETURN, b"\1\0\0\0\xff"), MAX_FRAME)


@settings(max_examples=300)
@given(st.binary(max_size=120))
def test_arbitrary_bytes_are_judged_as_the_general_path_judges_them(data):
    check_call_frame_agrees(data)
    check_result_frame_agrees(data)


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


@settings(max_examples=500)
@given(damaged_frames())
def test_damaged_frames_are_judged_as_the_general_path_judges_them(data):
    check_call_frame_agrees(data)
    check_result_frame_agrees(data)
