"""Sans-IO shared-secret authentication: a mutual HMAC-SHA256 challenge-response.

With authentication on, the accepting side (server, tracker, proxy) answers the
connecting peer's opening (the RPC handshake key, or the tracker magic) with a
challenge instead of its usual reply::

    service -> peer   i32 AUTH_CHALLENGE, 32-byte service nonce
    peer -> service   32-byte peer nonce, 32-byte HMAC(secret, "peer"    | context | nonces)
    service -> peer   i32 AUTH_OK,        32-byte HMAC(secret, "service" | context | nonces)
                 or   i32 AUTH_REFUSED, and the connection closes

and only then sends its usual reply. ``context`` binds the proof to what the
peer sent first (its handshake key, or the tracker magic), so a proof cannot be
moved to another key. The secret never crosses the wire; each side makes a fresh
nonce per connection, so a recorded exchange replayed to the service fails, and
a service that does not know the secret cannot pass itself off to the peer.
Every message has a fixed size, so the parsers need no length field to bound.
The standard library's ``hmac`` and ``os.urandom`` do the cryptography (the device
server stays standard-library only); ``hmac`` loads OpenSSL, so it is imported with the first
token, not by every client that talks to a tracker without one. The classes are sans-IO;
:func:`authenticate` is the thin blocking layer the clients use.
"""
from __future__ import annotations

import os
import socket
import struct

from ..errors import AuthenticationError, ProtocolError
from ..netutil import receive_until

AUTH_CHALLENGE = 0xFF2A1
AUTH_OK = 0xFF2A2
AUTH_REFUSED = 0xFF2A3
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_SECRET_BYTES = 4096
MIN_SECRET_BYTES = 8
ENV_TOKEN = "KERNELRPC_AUTH_TOKEN"
ENV_TOKEN_FILE = "KERNELRPC_AUTH_TOKEN_FILE"

_I32 = struct.Struct("<i")
_LABEL = b"kernelrpc-auth-v1"
CHALLENGE_HEAD = _I32.pack(AUTH_CHALLENGE)
AUTH_CONTEXT = b"kernelrpc-tracker"
"""What a tracker peer's proof is bound to (an RPC peer's is bound to the handshake key it sent)."""


def check_secret(secret: bytes | str) -> bytes:
    """The secret as bytes, refused when empty, too short or too long."""
    data = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not MIN_SECRET_BYTES <= len(data) <= MAX_SECRET_BYTES:
        raise ValueError(f"an auth token must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes, "
                         f"got {len(data)}; make one with: python -c 'import secrets; print(secrets.token_hex(32))'")
    return data


def read_token_file(path: str) -> bytes:
    """A token file's contents without surrounding white space (a trailing newline is usual)."""
    with open(path, "rb") as f:
        data = f.read(MAX_SECRET_BYTES + 2)
    return check_secret(data.strip())


def resolve_token(auth_token: bytes | str | None = None, token_file: str | None = None) -> bytes | None:
    """The secret a caller asked for: the argument, else the file, else the environment, else None."""
    if auth_token is not None:
        return check_secret(auth_token)
    if token_file:
        return read_token_file(token_file)
    if os.environ.get(ENV_TOKEN):
        return check_secret(os.environ[ENV_TOKEN].strip())
    if os.environ.get(ENV_TOKEN_FILE):
        return read_token_file(os.environ[ENV_TOKEN_FILE])
    return None


def _mac(secret: bytes, who: bytes, context: bytes, service_nonce: bytes, peer_nonce: bytes) -> bytes:
    import hashlib
    import hmac

    message = b"|".join((_LABEL, who, hashlib.sha256(context).digest(), service_nonce, peer_nonce))
    return hmac.new(secret, message, hashlib.sha256).digest()


def _same(a: bytes, b: bytes) -> bool:
    import hmac

    return hmac.compare_digest(a, b)


class ServiceAuth:
    """The accepting side. Send :meth:`challenge`, :meth:`feed` the peer's bytes.

    ``feed`` returns None until the peer's answer is complete, then the bytes to send back;
    ``ok`` says whether the peer proved it knows the secret (when False, send the bytes and
    close). Bytes after the answer are kept in ``unused``.
    """

    def __init__(self, secret: bytes, context: bytes) -> None:
        self._secret = secret
        self._context = context
        self.nonce = os.urandom(NONCE_BYTES)
        self._buf = bytearray()
        self.ok: bool | None = None
        self.unused = b""

    def challenge(self) -> bytes:
        return CHALLENGE_HEAD + self.nonce

    def feed(self, data: bytes) -> bytes | None:
        if self.ok is not None:
            raise ProtocolError("authentication already finished")
        self._buf += data
        need = NONCE_BYTES + MAC_BYTES
        if len(self._buf) < need:
            return None
        peer_nonce, mac = bytes(self._buf[:NONCE_BYTES]), bytes(self._buf[NONCE_BYTES:need])
        self.unused = bytes(self._buf[need:])
        self._buf.clear()
        expected = _mac(self._secret, b"peer", self._context, self.nonce, peer_nonce)
        self.ok = _same(mac, expected) and peer_nonce != self.nonce
        if not self.ok:
            return _I32.pack(AUTH_REFUSED)
        return _I32.pack(AUTH_OK) + _mac(self._secret, b"service", self._context, self.nonce, peer_nonce)


class PeerAuth:
    """The connecting side. :meth:`feed` the service's bytes after sending the opening.

    Returns the answer to send once the challenge is complete, then True once the service
    has proved it knows the secret too; None while more bytes are needed. A refusal or a
    wrong proof raises :class:`AuthenticationError`. Bytes after the verdict are in ``unused``.
    """

    def __init__(self, secret: bytes, context: bytes, where: str = "peer") -> None:
        self._secret = secret
        self._context = context
        self._where = where
        self.nonce = os.urandom(NONCE_BYTES)
        self._service_nonce: bytes | None = None
        self._buf = bytearray()
        self.done = False
        self.unused = b""

    def feed(self, data: bytes) -> bytes | bool | None:
        if self.done:
            raise ProtocolError("authentication already finished")
        self._buf += data
        if self._service_nonce is None:
            if len(self._buf) < 4 + NONCE_BYTES:
                if len(self._buf) >= 4 and bytes(self._buf[:4]) != CHALLENGE_HEAD:
                    raise self._not_challenge()
                return None
            if bytes(self._buf[:4]) != CHALLENGE_HEAD:
                raise self._not_challenge()
            self._service_nonce = bytes(self._buf[4:4 + NONCE_BYTES])
            del self._buf[:4 + NONCE_BYTES]
            if self._buf:
                raise ProtocolError(f"{self._where} sent bytes after its challenge before our answer")
            return self.nonce + _mac(self._secret, b"peer", self._context, self._service_nonce, self.nonce)
        if len(self._buf) < 4:
            return None
        code = _I32.unpack(self._buf[:4])[0]
        if code == AUTH_REFUSED:
            raise AuthenticationError(f"{self._where} refused our auth token: it expects another one")
        if code != AUTH_OK:
            raise ProtocolError(f"{self._where} answered code {code:#x} to our authentication")
        if len(self._buf) < 4 + MAC_BYTES:
            return None
        mac = bytes(self._buf[4:4 + MAC_BYTES])
        self.unused = bytes(self._buf[4 + MAC_BYTES:])
        self._buf.clear()
        self.done = True
        if not _same(mac, _mac(self._secret, b"service", self._context, self._service_nonce,
                               self.nonce)):
            raise AuthenticationError(f"{self._where} accepted us but could not prove it knows the token: "
                                      "it is not the service you meant to reach")
        return True

    def _not_challenge(self) -> AuthenticationError:
        return AuthenticationError(
            f"{self._where} does not ask for authentication, but an auth token was given: it runs "
            "without --auth-token-file (or is not a kernelrpc service); refusing to go on unauthenticated")



def refusal_for_unauthenticated(where: str) -> AuthenticationError:
    """The error a peer without a token gets when the service challenges it."""
    return AuthenticationError(
        f"{where} requires authentication: pass auth_token=... (or set {ENV_TOKEN}, or "
        f"{ENV_TOKEN_FILE} to a file holding the token)")


def authenticate(sock: socket.socket, token: bytes, context: bytes, where: str) -> bytes:
    """The blocking peer side over ``sock``, after the opening was sent: answer the challenge,
    check the service's proof; returns the bytes that followed the verdict. The socket's own
    timeout bounds each read (``socket.timeout`` is raised as it is)."""
    peer = PeerAuth(token, context, where)
    sock.sendall(_read_step(sock, peer, where))
    _read_step(sock, peer, where)
    return peer.unused


def _read_step(sock: socket.socket, peer: PeerAuth, where: str):
    return receive_until(sock, peer, where, "authentication", bufsize=4096)
