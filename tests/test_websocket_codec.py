"""The proxy's sans-IO WebSocket codec (RFC 6455, server side)."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc.errors import ProtocolError
from kernelrpc.proxy import websocket as ws

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 section 1.3


def request(path="/ws", **headers) -> bytes:
    fields = {"Host": "proxy", "Upgrade": "websocket", "Connection": "keep-alive, Upgrade",
              "Sec-WebSocket-Key": KEY, "Sec-WebSocket-Version": "13"}
    fields.update({name.replace("_", "-"): value for name, value in headers.items()})
    lines = [f"GET {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in fields.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_accept_key_is_the_rfc_example():
    assert ws.accept_key(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_upgrade_request_in_pieces_with_frames_behind_it():
    parser = ws.UpgradeRequestParser()
    data = request("/ws?x=1") + b"\x82\x80abcd"
    assert parser.feed(data[:10]) is None
    parsed = parser.feed(data[10:])
    assert parsed.key == KEY and parsed.leftover == b"\x82\x80abcd"
    response = ws.accept_response(parsed)
    assert response.startswith(b"HTTP/1.1 101 ") and b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in response


@pytest.mark.parametrize("data, status", [
    (request("/"), "404"),
    (request().replace(b"GET", b"PUT", 1), "405"),
    (request(Upgrade=None), "426"),
    (request(Connection="keep-alive"), "426"),
    (request(Sec_WebSocket_Version="8"), "426"),
    (request(Sec_WebSocket_Key="short"), "400"),
    (request(Sec_WebSocket_Key=None), "400"),
    (b"GET /ws\r\n\r\n", "400"),
    (b"GET /ws HTTP/1.1\r\nbroken header\r\n\r\n", "400"),
    (b"GET /ws HTTP/1.1\r\nHost: \xff\r\n\r\n", "400"),
    (b"GET /ws HTTP/1.1\r\nX: " + b"a" * 9000, "431"),
])
def test_bad_upgrade_requests_get_an_http_answer(data, status):
    with pytest.raises(ws.UpgradeRejected) as info:
        ws.UpgradeRequestParser().feed(data)
    assert info.value.response.startswith(f"HTTP/1.1 {status}".encode())
    assert info.value.response.endswith(b"\n")


def client_frame(opcode, payload=b"", fin=True, mask=b"\x01\x02\x03\x04"):
    return ws.encode_frame(opcode, payload, mask=mask, fin=fin)


def decode_all(data: bytes, pieces: list[int] | None = None) -> list:
    decoder, events, at = ws.FrameDecoder(), [], 0
    for size in pieces or []:
        events += decoder.feed(data[at:at + size])
        at += size
    events += decoder.feed(data[at:])
    return events


def payload_of(events) -> bytes:
    return b"".join(e.payload for e in events if isinstance(e, ws.Data))


@settings(max_examples=150, deadline=None)
@given(payload=st.binary(max_size=70000), mask=st.binary(min_size=4, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=70000), max_size=4),
       pieces=st.lists(st.integers(min_value=0, max_value=9000), max_size=8))
def test_fragmented_masked_messages_decode_to_their_payload(payload, mask, cuts, pieces):
    bounds = sorted({0, len(payload), *[c % (len(payload) + 1) for c in cuts]})
    parts = [payload[a:b] for a, b in itertools.pairwise(bounds)] or [b""]
    stream = b""
    for i, part in enumerate(parts):
        opcode = ws.BINARY if i == 0 else ws.CONTINUATION
        stream += client_frame(opcode, part, fin=i == len(parts) - 1, mask=mask)
        if i == 0:
            stream += client_frame(ws.PING, b"hi", mask=mask)  # control frames may interleave
    events = decode_all(stream, pieces)
    assert payload_of(events) == payload
    assert ws.Ping(b"hi") in events


def test_length_encodings_and_close_codes():
    for n in (0, 125, 126, 65535, 65536):
        assert payload_of(decode_all(client_frame(ws.BINARY, b"x" * n))) == b"x" * n
    events = decode_all(client_frame(ws.PONG, b"p") + client_frame(ws.CLOSE, b"\x03\xe8bye"))
    assert events == [ws.Pong(b"p"), ws.Close(1000, "bye")]
    assert decode_all(client_frame(ws.CLOSE)) == [ws.Close(None, "")]


def test_server_frames_are_unmasked_and_decode_without_mask_checks():
    frame = ws.encode_frame(ws.BINARY, b"abc")
    assert frame == b"\x82\x03abc"
    assert ws.FrameDecoder(require_mask=False).feed(frame) == [ws.Data(b"abc")]
    assert ws.close_frame(1002, "x") == b"\x88\x03\x03\xeax"


@pytest.mark.parametrize("data, message", [
    (ws.encode_frame(ws.BINARY, b"abc"), "must be masked"),
    (client_frame(ws.TEXT, b"abc"), "text frame"),
    (b"\xc2\x80abcd", "reserved bits"),
    (b"\x83\x80abcd", "unknown opcode"),
    (client_frame(ws.PING, b"x" * 126), "control frames"),
    (client_frame(ws.PING, b"x", fin=False), "control frames"),
    (client_frame(ws.CONTINUATION, b"x"), "continuation frame outside"),
    (client_frame(ws.BINARY, b"x", fin=False) + client_frame(ws.BINARY, b"y"), "new message"),
    (b"\x82\xff\x80" + b"\x00" * 7 + b"abcd", r"2\*\*63"),
    (client_frame(ws.CLOSE, b"\x03"), "1-byte"),
    (client_frame(ws.CLOSE, b"\x03\xe8\xff"), "not UTF-8"),
    (client_frame(ws.CLOSE) + client_frame(ws.BINARY, b"late"), "after the close"),
])
def test_protocol_violations_raise_protocol_error(data, message):
    decoder = ws.FrameDecoder()
    with pytest.raises(ProtocolError, match=message):
        decoder.feed(data[:len(data) // 2 + 1])
        decoder.feed(data[len(data) // 2 + 1:])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    try:
        ws.FrameDecoder().feed(data)
    except ProtocolError:
        pass
    try:
        ws.UpgradeRequestParser().feed(data)
    except ProtocolError:
        pass


@pytest.mark.parametrize("n", [4095, 4096, 4097, 70001])
@pytest.mark.parametrize("offset", range(4))
def test_large_chunks_unmask_as_byte_by_byte(n, offset):
    data = bytes(range(256)) * (n // 256) + bytes(n % 256)
    mask = b"\x9a\x01\xfe\x37"
    expected = bytes(b ^ mask[(offset + i) % 4] for i, b in enumerate(data))
    assert ws._unmask(data, mask, offset) == expected
    assert ws._unmask(memoryview(data), mask, offset) == expected
