"""The session protocol codec, on bytes only: round trips, bounds, and hostile input."""
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc.errors import ProtocolError, VersionMismatch
from kernelrpc.wire import protocol as P
from kernelrpc.wire import hello
from kernelrpc.wire.hello import HelloParser, HelloReplyParser, check_client_version, encode_hello, encode_hello_accept, encode_hello_refuse
from kernelrpc.wire.values import (DTYPE_BYTES, MAX_DEPTH, DeviceValue, FunctionHandle, ModuleHandle,
                                   TensorHandle, TensorValue, decode_values, encode_values)

devices = st.builds(DeviceValue, st.just("cpu"), st.integers(0, 2**31 - 1))
dtypes = st.sampled_from(sorted(DTYPE_BYTES))
shapes = st.lists(st.integers(0, 4), max_size=4).map(tuple)
handles = st.integers(0, 2**64 - 1)


@st.composite
def inline_tensors(draw):
    dtype, shape = draw(dtypes), draw(shapes)
    n = DTYPE_BYTES[dtype]
    for dim in shape:
        n *= dim
    return TensorValue(dtype, shape, draw(devices), draw(st.binary(min_size=n, max_size=n)))


scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
           | st.floats(allow_nan=False) | st.text() | st.binary()
           | devices | inline_tensors() | st.builds(ModuleHandle, handles) | st.builds(FunctionHandle, handles)
           | st.builds(TensorHandle, handles, dtypes, st.lists(st.integers(0, 2**40), max_size=6).map(tuple),
                       devices))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=20)


@given(st.lists(values, max_size=6))
def test_values_round_trip(items):
    assert decode_values(encode_values(items)) == items


@given(st.lists(values, max_size=4))
def test_frames_round_trip_through_the_frame_reader_in_any_chunking(args):
    data = P.encode_call(3, args) + P.encode_return(args)
    reader = P.FrameReader()
    frames = []
    for i in range(0, len(data), 7):  # arbitrary chunking must not matter
        reader.feed(data[i:i + 7])
        while (frame := reader.next_frame()) is not None:
            frames.append(frame)
    assert [f.type for f in frames] == [P.REQUEST, P.RETURN]
    call = P.decode_request(frames[0].body)
    assert call.function_id == 3 and list(call.args) == args
    assert decode_values(frames[1].body) == args


def test_frame_reader_counts_pending_bytes():
    frame = P.encode_call(5, [1])
    reader = P.FrameReader()
    reader.feed(frame + frame[:3])
    assert reader.pending == len(frame) + 3
    assert reader.next_frame() == (P.REQUEST, frame[P.HEADER_SIZE:])
    assert reader.pending == 3 and reader.next_frame() is None
    reader.feed(frame[3:] + b"raw")
    assert reader.next_frame() == (P.REQUEST, frame[P.HEADER_SIZE:])
    assert reader.take(10) == b"raw" and reader.pending == 0


@given(handles, st.lists(values, max_size=4), values)
def test_call_codec_matches_the_general_request_codec(function_id, args, result):
    request = P.encode_call(function_id, args)
    assert request == P.encode_request(P.CALL, [FunctionHandle(function_id), *args])
    call = P.decode_call(request[P.HEADER_SIZE:])
    assert call.function_id == function_id and repr(list(call.args)) == repr(args)
    reply = P.encode_result(result)
    assert reply == P.encode_return([result])
    assert P.decode_result(reply[P.HEADER_SIZE:]) == result


def test_call_codec_rejects_malformed_calls():
    body = P.encode_request(P.CALL, [FunctionHandle(3), 1])[P.HEADER_SIZE:]
    for bad in (body[:-1], body + b"\0", body[:13], b"", P.encode_request(P.CALL, [1, 1])[P.HEADER_SIZE:],
                P.encode_request(P.CALL)[P.HEADER_SIZE:], P.encode_request(P.FREE, [FunctionHandle(3)])[P.HEADER_SIZE:]):
        with pytest.raises(ProtocolError):
            P.decode_call(bad)
    for bad in (encode_values([]), encode_values([1, 2]), encode_values([1])[:-1], encode_values([1]) + b"\0",
                b"\1\0\0\0\xff", b"\1\0\0\0"):
        with pytest.raises(ProtocolError):
            P.decode_result(bad)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    for parse in (decode_values, P.decode_request, P.decode_call, P.decode_result, P.decode_error,
                  P.decode_notice, P.decode_data_header):
        try:
            parse(data)
        except ProtocolError:
            pass
    reader = P.FrameReader(max_frame_bytes=64)
    try:
        reader.feed(data)
        while reader.next_frame() is not None:
            pass
    except ProtocolError:
        pass
    for parser in (HelloParser(), HelloReplyParser()):
        try:
            parser.feed(data)
        except ProtocolError:  # VersionMismatch is a ProtocolError too
            pass


@given(st.lists(values, min_size=1, max_size=4), st.data())
def test_truncated_or_corrupted_messages_raise_only_protocol_error(items, data):
    encoded = bytearray(encode_values(items))
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError):
        decode_values(bytes(encoded[:cut]))
    pos = data.draw(st.integers(0, len(encoded) - 1))
    encoded[pos] ^= data.draw(st.integers(1, 255))
    try:
        decode_values(bytes(encoded))
    except ProtocolError:
        pass


def test_counts_and_lengths_are_bounded_by_the_bytes_present():
    with pytest.raises(ProtocolError, match="value count"):
        decode_values(struct.pack("<I", 2**32 - 1))
    with pytest.raises(ProtocolError, match="truncated"):
        decode_values(struct.pack("<IBI", 1, 5, 2**32 - 1))  # a 4 GiB string announced in 9 bytes
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        P.parse_header(struct.pack("<IB", 2**31, P.REQUEST), max_frame_bytes=1 << 20)
    with pytest.raises(ProtocolError, match="unknown frame type"):
        P.parse_header(struct.pack("<IB", 1, 99), max_frame_bytes=1 << 20)


def test_nesting_and_layout_are_validated():
    deep = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nest"):
        encode_values([deep])
    with pytest.raises(ProtocolError, match="dtype"):
        encode_values([TensorHandle(1, "complex64", (1,), DeviceValue("cpu"))])
    with pytest.raises(ProtocolError, match="device type"):
        encode_values([DeviceValue("cuda", 0)])
    bad_shape = encode_values([TensorHandle(1, "int8", (3,), DeviceValue("cpu"))]).replace(
        struct.pack("<q", 3), struct.pack("<q", -3))
    with pytest.raises(ProtocolError, match="shape"):
        decode_values(bad_shape)


def test_tvm_kinitserver_is_recognised_as_tvm():
    captured = bytes.fromhex("1500000000000000 02000000 0500000000000000 302e382e30 00000000")
    version = HelloParser().feed(captured)
    assert version == "0.8.0"
    with pytest.raises(VersionMismatch, match="TVM RPC protocol 0.8.0") as info:
        check_client_version(version)
    assert info.value.ours == "kernelrpc/1" and info.value.theirs == "0.8.0"


def test_hello_exchange_round_trip():
    parser = HelloParser()
    hello = encode_hello()
    assert parser.feed(hello[:5]) is None
    assert parser.feed(hello[5:] + b"\x01") == P.VERSION_STRING
    assert parser.unused == b"\x01"
    check_client_version(P.VERSION_STRING)
    reply = HelloReplyParser().feed(encode_hello_accept({"session_timeout": 3}))
    assert reply.version == P.VERSION_STRING and reply.info["session_timeout"] == 3


def test_refusals_name_both_versions(monkeypatch):
    with pytest.raises(VersionMismatch, match="kernelrpc/0"):
        check_client_version("kernelrpc/0")
    monkeypatch.setattr(hello, "VERSION_STRING", "kernelrpc/2")  # a newer server refusing us
    with pytest.raises(VersionMismatch) as info:
        check_client_version("kernelrpc/1")
    monkeypatch.undo()
    with pytest.raises(VersionMismatch, match="kernelrpc/2") as seen:
        HelloReplyParser().feed(encode_hello_refuse(str(info.value)))
    assert seen.value.theirs == "kernelrpc/2" and seen.value.ours == "kernelrpc/1"
    tvm_text = ("Check failed: client_protocol_ver == server_protocol_ver (kernelrpc/1 vs. 0.8.0) : "
                "Client protocol version mismatch with the server  server protocol=0.8.0, "
                "client protocol=kernelrpc/1")
    with pytest.raises(VersionMismatch, match="TVM RPC protocol 0.8.0") as seen:
        HelloReplyParser().feed(encode_hello_refuse(tvm_text))
    assert seen.value.theirs == "0.8.0"


def test_error_and_notice_frames():
    reader = P.FrameReader()
    reader.feed(P.encode_error("ValueError", "boom", "Traceback...") + P.encode_notice(
        P.NOTICE_CRASHED, "died", signal=11) + P.encode_data_header(12) + b"raw-payload!")
    assert P.decode_error(reader.next_frame().body) == ("ValueError", "boom", "Traceback...")
    assert P.decode_notice(reader.next_frame().body) == (P.NOTICE_CRASHED, "died", 11, None)
    assert P.decode_data_header(reader.next_frame().body) == 12
    assert reader.take(100) == b"raw-payload!"


def test_a_tvm_server_accepting_the_hello_is_a_version_mismatch():
    tvm_accept = bytes.fromhex("0c00000000000000 04000000 01000000 00000000")  # kReturn [None]
    with pytest.raises(VersionMismatch, match="TVM RPC"):
        HelloReplyParser().feed(tvm_accept)


def test_hello_reply_limits_are_validated():
    bad = encode_hello_accept({"max_frame_bytes": -1})
    with pytest.raises(ProtocolError, match="max_frame_bytes"):
        HelloReplyParser().feed(bad)
    info = HelloReplyParser().feed(encode_hello_accept({})).info
    assert info["max_frame_bytes"] == P.DEFAULT_MAX_FRAME_BYTES and info["session_timeout"] == 0
