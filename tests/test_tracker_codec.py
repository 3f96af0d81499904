import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelrpc.errors import ProtocolError
from kernelrpc.wire import tracker_codec
from kernelrpc.wire.tracker_codec import (
    MAGIC_BYTES,
    Code,
    FrameDecoder,
    check_magic,
    decode_json,
    encode_address_reply,
    encode_frame,
    encode_json,
)

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4),
                           max_leaves=20)


def test_frames_match_tvm_capture():
    put = encode_frame([3, "testkey", [19090, "testkey:0.8880375067090914"], None])
    assert put[:4] == bytes.fromhex("3b000000")
    assert put[4:] == b'[3, "testkey", [19090, "testkey:0.8880375067090914"], null]'
    assert encode_frame([1]) == bytes.fromhex("03000000") + b"[1]"
    assert MAGIC_BYTES == bytes.fromhex("71f20200")


def test_decoder_handles_split_and_pipelined_frames():
    stream = encode_frame([1]) + encode_frame([6]) + encode_frame({"a": [1, 2]})
    dec = FrameDecoder()
    out = []
    for i in range(len(stream)):
        out += dec.feed(stream[i:i + 1])
    assert out == [[1], [6], {"a": [1, 2]}]
    assert FrameDecoder().feed(stream) == out


def test_decoder_copies_from_a_reused_buffer_and_keeps_the_partial_tail():
    stream = encode_frame([4, "k\u00e9y", "", 1]) + encode_frame([1]) + encode_frame([6])
    shared = bytearray(64)
    dec = FrameDecoder()
    shared[:len(stream) - 2] = stream[:-2]
    assert dec.feed(memoryview(shared)[:len(stream) - 2]) == [[4, "k\u00e9y", "", 1], [1]]
    shared[:2] = stream[-2:]
    assert dec.feed(memoryview(shared)[:2]) == [[6]]
    assert dec.buffered == 0


@pytest.mark.parametrize("body", ['[1]'.encode("utf-16"), b'["\xff"]', b"[1] [2]"])
def test_decoder_takes_one_utf8_json_value_per_frame_like_tvm(body):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack("<i", len(body)) + body)


@pytest.mark.parametrize("bad", [struct.pack("<i", 0), struct.pack("<i", -5), struct.pack("<i", (1 << 20) + 1),
                                 struct.pack("<i", 3) + b"[1,"])
def test_decoder_rejects_bad_frames(bad):
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(bad)


def test_check_magic():
    check_magic(MAGIC_BYTES)
    with pytest.raises(ProtocolError):
        check_magic(b"\x71\xf2\x0f\x00")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4), max_leaves=20))
def test_round_trip(obj):
    assert FrameDecoder().feed(encode_frame(obj)) == [obj]


@given(st.binary(max_size=64))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    try:
        FrameDecoder().feed(data)
    except ProtocolError:
        pass


@given(st.text(max_size=40), st.one_of(st.integers(0, 65535), st.integers(0, 65535).map(str)), st.text(max_size=40))
def test_address_reply_is_the_generic_frame(host, port, matchkey):
    assert encode_address_reply(host, port, matchkey) == encode_frame([0, [host, port, matchkey]])


@pytest.mark.parametrize("text", ['[1]', ' [1]', '[1] ', '\n{"a": 1}\t', '[1] [2]', '', ' ', '[1', '\ufeff[1]', 'x'])
def test_decode_json_is_json_loads(text):
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            decode_json(text)
    else:
        assert decode_json(text) == expected


@given(JSON_VALUES)
def test_encode_json_is_json_dumps(obj):
    assert encode_json(obj) == json.dumps(obj)


@given(JSON_VALUES, st.sampled_from(["", " ", "\n", "\t\r "]), st.sampled_from(["", " ", "\n\n"]))
def test_decode_json_is_json_loads_around_any_whitespace(obj, lead, trail):
    text = lead + json.dumps(obj) + trail
    assert json.dumps(decode_json(text)) == json.dumps(json.loads(text))   # NaN != NaN, but its text is


def test_encode_json_refuses_what_json_dumps_refuses():
    circular: list = []
    circular.append(circular)
    for bad, error in ((object(), TypeError), ({1j: 1}, TypeError), (circular, ValueError)):
        with pytest.raises(error) as ours:
            encode_json(bad)
        with pytest.raises(error) as theirs:
            json.dumps(bad)
        assert str(ours.value) == str(theirs.value)


def test_tracker_code_is_the_int_enum_of_the_plain_codes():
    from kernelrpc.wire.tracker_codec import TrackerCode

    assert {c.name: int(c) for c in TrackerCode} == {k: v for k, v in vars(Code).items() if k.isupper()}
    assert TrackerCode(4) is TrackerCode.REQUEST == Code.REQUEST and tracker_codec.TrackerCode is TrackerCode
    assert encode_frame([TrackerCode.PING]) == encode_frame([Code.PING])
    with pytest.raises(AttributeError, match="no_such_name"):
        tracker_codec.no_such_name
