import struct

import pytest
from hypothesis import given, strategies as st

from kernelrpc.errors import HandshakeError, ProtocolError
from kernelrpc.wire import handshake as hs


def test_preamble_bytes_match_tvm_capture():
    key = "client:testkey:0.8880375067090914 -timeout=60"
    data = hs.encode_preamble(key)
    assert data[:8] == bytes.fromhex("71f20f00 2d000000")
    assert data[8:] == key.encode()


def test_success_reply_bytes_match_tvm_capture():
    assert hs.encode_reply(hs.RPC_CODE_SUCCESS, "server:testkey") == bytes.fromhex(
        "71f20f00 0e000000") + b"server:testkey"
    assert hs.encode_reply(hs.RPC_CODE_MISMATCH) == bytes.fromhex("73f20f00")


def test_preamble_parser_byte_by_byte_keeps_trailing_bytes():
    data = hs.encode_preamble("client:abc -timeout=5") + b"rest"
    parser = hs.PreambleParser()
    results = [parser.feed(data[i:i + 1]) for i in range(len(data) - 4)]
    assert results[:-1] == [None] * (len(results) - 1)
    assert results[-1] == "client:abc -timeout=5"
    parser2 = hs.PreambleParser()
    assert parser2.feed(data) == "client:abc -timeout=5"
    assert parser2.unused == b"rest"


def test_parse_key_and_timeout():
    parsed = hs.parse_key("client:rpi:0.5 -timeout=60")
    assert (parsed.role, parsed.matchkey, parsed.timeout) == ("client", "rpi:0.5", 60.0)
    assert hs.parse_key("client:").matchkey == ""
    assert hs.parse_key("server:proxkey").role == "server"
    assert hs.parse_key("client:k -timeout=0").timeout is None
    with pytest.raises(HandshakeError):
        _ = hs.parse_key("client:k -timeout=abc").timeout
    assert hs.make_key("client", "k", 2.4) == "client:k -timeout=2"


@pytest.mark.parametrize("head, words", [
    (struct.pack("<i", hs.RPC_TRACKER_MAGIC), "tracker"),
    (b"GET / HTTP/1.1\r\n", "HTTP"),
    (b"\x00\x00\x00\x00", "not a kernelrpc"),
])
def test_wrong_magic_names_the_peer(head, words):
    with pytest.raises(ProtocolError, match=words):
        hs.PreambleParser().feed(head)


def test_key_length_is_bounded():
    with pytest.raises(ProtocolError, match="length"):
        hs.PreambleParser().feed(struct.pack("<ii", hs.RPC_MAGIC, 1 << 30))
    with pytest.raises(ProtocolError, match="length"):
        hs.PreambleParser().feed(struct.pack("<ii", hs.RPC_MAGIC, -1))


def test_reply_parser_codes():
    for code in (hs.RPC_CODE_MISMATCH, hs.RPC_CODE_DUPLICATE):
        reply = hs.ReplyParser().feed(struct.pack("<i", code))
        assert not reply.ok
        with pytest.raises(HandshakeError):
            reply.raise_for_code()
    reply = hs.ReplyParser().feed(hs.encode_reply(hs.RPC_CODE_SUCCESS, "server:k"))
    assert reply.ok and reply.key == "server:k"


@given(st.text(max_size=200))
def test_preamble_round_trip(key):
    assert hs.PreambleParser().feed(hs.encode_preamble(key)) == key


@given(st.binary(max_size=64))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    for parser in (hs.PreambleParser(), hs.ReplyParser()):
        try:
            parser.feed(data)
        except ProtocolError:
            pass
