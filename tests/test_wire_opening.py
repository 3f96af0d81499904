"""The accepting side's opening machine (kernelrpc.wire.opening) without sockets."""
import struct

import pytest
from hypothesis import given, settings, strategies as st

from kernelrpc.errors import HandshakeError
from kernelrpc.wire import opening as O
from kernelrpc.wire.auth import AUTH_CONTEXT, AUTH_REFUSED, CHALLENGE_HEAD, PeerAuth
from kernelrpc.wire.handshake import MAX_KEY_BYTES, RPC_MAGIC, encode_preamble, parse_key
from kernelrpc.wire.tls import PLAINTEXT_REFUSAL
from kernelrpc.wire.tracker_codec import MAGIC_BYTES

TOKEN = b"opening-test-token"
RPC = O.OpeningConfig(O.Preamble.RPC, timeout=10.0)
TRACKER = O.OpeningConfig(O.Preamble.TRACKER, timeout=10.0)
PREAMBLE = encode_preamble("client:board")


def feed(m, data, now=0.0):
    return m.handle(O.DataReceived(data), now)


def final(actions):
    """The Accept or Reject among ``actions`` (None while the opening goes on)."""
    ends = [a for a in actions if isinstance(a, (O.Accept, O.Reject))]
    assert len(ends) <= 1
    return ends[0] if ends else None


def answer(actions, key: bytes, token=TOKEN):
    """A peer's answer to the challenge among ``actions`` (and the peer, to check the verdict)."""
    (challenge,) = [a.data for a in actions if isinstance(a, O.Send) and a.data[:4] == CHALLENGE_HEAD]
    peer = PeerAuth(token, key)
    return peer.feed(challenge), peer


# -- transitions, one by one ------------------------------------------------------------------
def test_rpc_preamble_in_one_piece_is_accepted_with_what_follows():
    m = O.OpeningMachine(RPC, 0.0)
    assert m.state is O.State.PREAMBLE
    assert feed(m, PREAMBLE + b"hello") == [O.Accept("client:board", b"hello")]
    assert m.state is O.State.OPEN and m.done


def test_rpc_preamble_byte_by_byte_asks_for_more_within_the_bound():
    m = O.OpeningMachine(RPC, 0.0)
    for i, byte in enumerate(PREAMBLE[:-1]):
        (need,) = feed(m, bytes([byte]))
        assert need == O.NeedData(8 + MAX_KEY_BYTES - (i + 1))
        assert m.buffered == i + 1
    assert feed(m, PREAMBLE[-1:]) == [O.Accept("client:board", b"")]


@pytest.mark.parametrize("head, words", [
    (b"GET / HTTP/1.1\r\n", "HTTP client"),
    (MAGIC_BYTES, "tracker client"),
    (b"\x00\x01\x02\x03", "first bytes 00 01 02 03"),
])
def test_a_foreign_preamble_is_refused_saying_what_the_peer_is(head, words):
    (reject,) = feed(O.OpeningMachine(RPC, 0.0), head)
    assert reject.refusal is O.Refusal.BAD_PREAMBLE and words in reject.detail
    assert reject.reply == b"" and not reject.gently


def test_a_tls_hello_to_a_plain_service_is_named():
    for config in (RPC, TRACKER):
        (reject,) = feed(O.OpeningMachine(config, 0.0), b"\x16\x03\x01\x02\x00")
        assert reject.refusal is O.Refusal.TLS_UNEXPECTED


@pytest.mark.parametrize("body", [struct.pack("<ii", RPC_MAGIC, MAX_KEY_BYTES + 1),
                                  struct.pack("<ii", RPC_MAGIC, -1),
                                  struct.pack("<ii", RPC_MAGIC, 2) + b"\xff\xfe"])
def test_a_bad_length_or_key_is_refused(body):
    (reject,) = feed(O.OpeningMachine(RPC, 0.0), body)
    assert reject.refusal is O.Refusal.BAD_PREAMBLE


def test_check_key_vets_the_key_before_any_challenge():
    def check(key):
        parsed = parse_key(key)
        parsed.timeout
        return parsed

    config = RPC._replace(check_key=check, auth_token=TOKEN)
    (reject,) = feed(O.OpeningMachine(config, 0.0), encode_preamble("client:k -timeout=x"))
    assert reject.refusal is O.Refusal.BAD_KEY and "-timeout" in reject.detail
    m = O.OpeningMachine(config._replace(auth_token=None), 0.0)
    assert feed(m, encode_preamble("client:k -timeout=5")) == [
        O.Accept("client:k -timeout=5", b"", parse_key("client:k -timeout=5"))]


def test_check_key_errors_are_refusals():
    def check(key):
        raise HandshakeError("no such key")

    (reject,) = feed(O.OpeningMachine(RPC._replace(check_key=check), 0.0), PREAMBLE)
    assert reject == O.Reject(O.Refusal.BAD_KEY, "no such key")


def test_tracker_magic_is_echoed_and_the_rest_kept():
    m = O.OpeningMachine(TRACKER, 0.0)
    assert feed(m, MAGIC_BYTES[:3]) == [O.NeedData(1)]
    assert feed(m, MAGIC_BYTES[3:] + b"frame") == [O.Send(MAGIC_BYTES), O.Accept("", b"frame")]


def test_a_wrong_tracker_magic_is_refused_with_its_bytes():
    (reject,) = feed(O.OpeningMachine(TRACKER, 0.0), b"\x01\x02\x03\x04")
    assert reject == O.Reject(O.Refusal.BAD_PREAMBLE, "first bytes 01 02 03 04")


def test_rpc_auth_challenge_bound_to_the_key_then_accept():
    m = O.OpeningMachine(RPC._replace(auth_token=TOKEN), 0.0)
    actions = feed(m, PREAMBLE)
    assert m.state is O.State.AUTH and actions[-1] == O.NeedData(64)
    reply, peer = answer(actions, b"client:board")
    actions = feed(m, reply + b"rest")
    verdict, accept = actions
    assert peer.feed(verdict.data) is True          # the service proved it knows the token
    assert accept == O.Accept("client:board", b"rest")


def test_an_answer_sent_with_the_preamble_is_read_at_once():
    first = O.OpeningMachine(RPC._replace(auth_token=TOKEN), 0.0)
    # the answer depends on the challenge: a peer cannot send it early, but bytes that
    # came with the preamble are the answer's start
    actions = feed(first, PREAMBLE + b"x" * 10)
    assert first.buffered == 10 and actions[-1] == O.NeedData(54)


def test_a_wrong_answer_is_refused_with_the_refusal_code():
    m = O.OpeningMachine(RPC._replace(auth_token=TOKEN), 0.0)
    reply, _ = answer(feed(m, PREAMBLE), b"client:board", token=b"another-token")
    (reject,) = feed(m, reply)
    assert reject.refusal is O.Refusal.AUTH_FAILED
    assert reject.reply == struct.pack("<i", AUTH_REFUSED) and not reject.gently


def test_tracker_auth_uses_the_tracker_context_then_echoes_the_magic():
    m = O.OpeningMachine(TRACKER._replace(auth_token=TOKEN), 0.0)
    reply, peer = answer(feed(m, MAGIC_BYTES), AUTH_CONTEXT)
    verdict, echo, accept = feed(m, reply)
    assert peer.feed(verdict.data) is True
    assert echo == O.Send(MAGIC_BYTES) and accept == O.Accept("", b"")


def test_tls_sniff_plaintext_is_refused_gently_with_the_refusal():
    m = O.OpeningMachine(RPC._replace(tls=True), 0.0)
    assert m.state is O.State.SNIFF
    assert feed(m, b"") == [O.NeedData(1)]
    assert feed(m, PREAMBLE) == [O.Reject(O.Refusal.PLAINTEXT, "first byte 71", PLAINTEXT_REFUSAL, True)]


def test_tls_hello_starts_tls_then_the_preamble_follows():
    m = O.OpeningMachine(RPC._replace(tls=True), 0.0)
    assert feed(m, b"\x16\x03\x01") == [O.StartTLS()]
    assert feed(m, PREAMBLE) == []                  # raw bytes during TLS are TLS's, not ours
    assert m.handle(O.TLSEstablished(), 0.0) == []
    assert feed(m, PREAMBLE) == [O.Accept("client:board", b"")]


def test_a_failed_tls_handshake_is_refused_gently():
    m = O.OpeningMachine(TRACKER._replace(tls=True), 0.0)
    feed(m, b"\x16")
    assert m.handle(O.TLSFailed("unknown ca"), 1.0) == [O.Reject(O.Refusal.TLS_FAILED, "unknown ca", b"", True)]


@pytest.mark.parametrize("config, opening", [(RPC._replace(tls=True), b""), (RPC._replace(tls=True), b"\x16"),
                                             (RPC, PREAMBLE[:5]), (RPC._replace(auth_token=TOKEN), PREAMBLE)])
def test_the_deadline_covers_every_step(config, opening):
    m = O.OpeningMachine(config, 100.0)
    assert m.deadline == 110.0
    feed(m, opening, 101.0)
    assert m.handle(O.TimerFired(), 109.9) == []
    (reject,) = m.handle(O.TimerFired(), 110.0)
    assert reject.refusal is O.Refusal.TIMEOUT and "10 s" in reject.detail


def test_the_peer_closing_mid_opening_is_a_refusal():
    m = O.OpeningMachine(RPC, 0.0)
    feed(m, PREAMBLE[:3])
    assert m.handle(O.ConnectionClosed(), 0.0) == [O.Reject(O.Refusal.CLOSED, "the peer closed the connection")]


def test_nothing_happens_after_the_end():
    for opening in (PREAMBLE, b"nope"):
        m = O.OpeningMachine(RPC, 0.0)
        feed(m, opening)
        for event in (O.DataReceived(PREAMBLE), O.TimerFired(), O.ConnectionClosed(), O.TLSEstablished(),
                      O.TLSFailed("x")):
            assert m.handle(event, 1e9) == []


# -- arbitrary bytes and events ---------------------------------------------------------------
CONFIGS = [RPC, TRACKER, RPC._replace(auth_token=TOKEN), TRACKER._replace(auth_token=TOKEN),
           RPC._replace(tls=True), RPC._replace(check_key=lambda key: parse_key(key).timeout)]


def run(config, chunks):
    """Feed ``chunks``; check the invariants on the way; the outcome, with every byte the
    opening did not take (the end's leftover and the chunks after it)."""
    m = O.OpeningMachine(config, 0.0)
    end, after = None, b""
    for chunk in chunks:
        actions = feed(m, chunk)
        assert m.buffered <= O.MAX_OPENING_BYTES
        if end is not None:
            assert actions == []
            after += chunk
            continue
        end = final(actions)
        if end is None and m.state is not O.State.TLS:
            assert actions[-1] == O.NeedData(actions[-1].at_most)
            assert 0 < actions[-1].at_most <= O.MAX_OPENING_BYTES
    if isinstance(end, O.Accept):
        return ("accept", end.key, end.leftover + after, end.checked)
    if isinstance(end, O.Reject):
        return ("reject", end.refusal, end.detail, end.reply if config.auth_token is None else None)
    return ("open", m.state, m.buffered)


def split(data, cuts):
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)])]


streams = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda key, tail: encode_preamble(key) + tail, st.text(max_size=40), st.binary(max_size=40)),
    st.builds(lambda tail: MAGIC_BYTES + tail, st.binary(max_size=80)),
    st.builds(lambda n, tail: struct.pack("<ii", RPC_MAGIC, n) + tail, st.integers(-2**31, 2**31 - 1),
              st.binary(max_size=80)),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(CONFIGS), streams, st.lists(st.integers(0, 10_000), max_size=12))
def test_any_bytes_any_split_same_outcome(config, data, cuts):
    assert run(config, split(data, cuts)) == run(config, [data])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.binary(max_size=60), st.lists(st.integers(0, 10_000), max_size=8),
       st.lists(st.integers(0, 10_000), max_size=8))
def test_a_right_opening_split_anywhere_is_accepted_with_its_tail(key, tail, cuts, answer_cuts):
    if len(key.encode()) > MAX_KEY_BYTES:
        return
    m = O.OpeningMachine(RPC._replace(auth_token=TOKEN), 0.0)
    actions = []
    for chunk in split(encode_preamble(key), cuts):
        actions += feed(m, chunk)
    reply, peer = answer(actions, key.encode())
    actions = []
    for chunk in split(reply + tail, answer_cuts):
        actions += feed(m, chunk)
    accept = final(actions)
    got = accept.leftover + b"".join(split(reply + tail, answer_cuts))[len(reply) + len(accept.leftover):]
    assert (accept.key, got) == (key, tail)


events = st.one_of(
    st.builds(O.DataReceived, st.one_of(st.binary(max_size=64), st.just(PREAMBLE), st.just(MAGIC_BYTES),
                                        st.just(b"\x16\x03\x01"))),
    st.just(O.TimerFired()), st.just(O.ConnectionClosed()), st.just(O.TLSEstablished()),
    st.builds(O.TLSFailed, st.text(max_size=10)),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(CONFIGS + [TRACKER._replace(tls=True, auth_token=TOKEN)]),
       st.lists(st.tuples(events, st.floats(0, 30)), max_size=30))
def test_any_events_end_in_one_typed_outcome_or_ask_for_more(config, script):
    m = O.OpeningMachine(config, 0.0)
    ends = []
    for event, now in script:
        actions = m.handle(event, now)
        assert all(isinstance(a, (O.Send, O.StartTLS, O.NeedData, O.Accept, O.Reject)) for a in actions)
        assert m.buffered <= O.MAX_OPENING_BYTES
        if ends:
            assert actions == []
        ends += [a for a in actions if isinstance(a, (O.Accept, O.Reject))]
        if isinstance(event, O.TimerFired) and now >= m.deadline:
            assert m.done
    assert len(ends) <= 1 and m.done == bool(ends)
    assert all(isinstance(e.refusal, O.Refusal) for e in ends if isinstance(e, O.Reject))


def test_the_key_bound_is_the_handshake_codec_s():
    from kernelrpc.wire import handshake

    assert O.MAX_KEY_BYTES == handshake.MAX_KEY_BYTES


def test_records_are_immutable_values():
    config = O.OpeningConfig(O.Preamble.RPC, timeout=3.0)
    assert config == O.OpeningConfig(O.Preamble.RPC, False, None, 3.0) and hash(config) == hash(config._replace())
    assert config._replace(tls=True).tls and not config.tls
    with pytest.raises(AttributeError):
        config.tls = True
    with pytest.raises(TypeError):
        O.Send()
    with pytest.raises(TypeError):
        O.Send(b"", extra=1)
    assert repr(O.Accept("k", b"")) == "Accept(key='k', leftover=b'', checked=None)"
