"""The sans-IO challenge-response (wire/auth.py): right token, wrong token, replay, garbage."""
import pytest
from hypothesis import given, settings, strategies as st

from kernelrpc.errors import AuthenticationError, ProtocolError
from kernelrpc.wire import auth as A
from kernelrpc.wire import handshake as H

SECRET = b"correct horse battery staple"
CONTEXT = b"client:rpi4"


def run(service_secret, peer_secret, context=CONTEXT, chunk=None):
    service = A.ServiceAuth(service_secret, context)
    peer = A.PeerAuth(peer_secret, context, "the server")
    answer = feed_in_chunks(peer, service.challenge(), chunk)
    verdict = feed_in_chunks(service, answer, chunk)
    return service, peer, answer, verdict


def feed_in_chunks(parser, data, chunk):
    if not chunk:
        return parser.feed(data)
    out = None
    for i in range(0, len(data), chunk):
        out = parser.feed(data[i:i + chunk])
    return out


@pytest.mark.parametrize("chunk", [None, 1, 7])
def test_right_token_authenticates_both_ways(chunk):
    service, peer, _, verdict = run(SECRET, SECRET, chunk=chunk)
    assert service.ok is True
    assert feed_in_chunks(peer, verdict, chunk) is True


def test_bytes_after_the_verdict_are_kept():
    _, peer, _, verdict = run(SECRET, SECRET)
    assert peer.feed(verdict + b"rest") is True and peer.unused == b"rest"


def test_wrong_token_is_refused_and_the_peer_is_told():
    service, peer, _, verdict = run(SECRET, b"another token entirely")
    assert service.ok is False
    with pytest.raises(AuthenticationError, match="refused our auth token"):
        peer.feed(verdict)


def test_secret_never_crosses_the_wire():
    service, peer, answer, verdict = run(SECRET, SECRET)
    assert SECRET not in service.challenge() + answer + verdict


def test_replayed_answer_fails_against_a_fresh_challenge():
    _, _, answer, _ = run(SECRET, SECRET)
    replay = A.ServiceAuth(SECRET, CONTEXT)
    assert replay.feed(answer) is not None and replay.ok is False


def test_proof_is_bound_to_the_context():
    service = A.ServiceAuth(SECRET, b"client:other")
    peer = A.PeerAuth(SECRET, CONTEXT)
    service.feed(peer.feed(service.challenge()))
    assert service.ok is False


def test_service_without_the_token_cannot_impersonate():
    impostor_nonce = b"\x01" * A.NONCE_BYTES
    peer = A.PeerAuth(SECRET, CONTEXT, "the server")
    peer.feed(A.CHALLENGE_HEAD + impostor_nonce)
    with pytest.raises(AuthenticationError, match="could not prove"):
        peer.feed(A._I32.pack(A.AUTH_OK) + b"\x00" * A.MAC_BYTES)


def test_peer_expecting_auth_refuses_a_service_that_skips_it():
    peer = A.PeerAuth(SECRET, CONTEXT, "the server")
    with pytest.raises(AuthenticationError, match="does not ask for authentication"):
        peer.feed(H.encode_reply(H.RPC_CODE_SUCCESS, "server:rpi4"))


def test_client_without_token_gets_a_clear_error_from_the_handshake_parser():
    with pytest.raises(AuthenticationError, match="requires authentication"):
        H.ReplyParser().feed(A.ServiceAuth(SECRET, CONTEXT).challenge())


@pytest.mark.parametrize("bad", [b"", b"short", b"x" * (A.MAX_SECRET_BYTES + 1)])
def test_unusable_secrets_are_refused(bad):
    with pytest.raises(ValueError, match="auth token must be"):
        A.check_secret(bad)


def test_resolve_token_order(tmp_path, monkeypatch):
    monkeypatch.delenv(A.ENV_TOKEN, raising=False)
    monkeypatch.delenv(A.ENV_TOKEN_FILE, raising=False)
    assert A.resolve_token() is None
    path = tmp_path / "token"
    path.write_text("from-the-file\n")
    monkeypatch.setenv(A.ENV_TOKEN_FILE, str(path))
    assert A.resolve_token() == b"from-the-file"
    monkeypatch.setenv(A.ENV_TOKEN, "from-the-environment")
    assert A.resolve_token() == b"from-the-environment"
    assert A.resolve_token("given-explicitly") == b"given-explicitly"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_service_parser_never_crashes_on_garbage(chunks):
    service = A.ServiceAuth(SECRET, CONTEXT)
    for data in chunks:
        if service.ok is not None:
            break
        service.feed(data)
    assert service.ok in (None, False)  # garbage never authenticates


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_peer_parser_never_crashes_on_garbage(chunks):
    peer = A.PeerAuth(SECRET, CONTEXT)
    try:
        for data in chunks:
            peer.feed(data)
    except (AuthenticationError, ProtocolError):
        pass
