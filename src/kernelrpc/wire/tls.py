"""Optional TLS for every kernelrpc link, from the standard library's ``ssl``.

One :class:`TLSConfig` describes a process's part in a TLS fleet: the CA bundle
its peers' certificates must chain to, and its own certificate and key. The same
configuration serves both roles a process plays (a device server listens for
clients and also connects to a tracker), so a lab hands every machine the same
three files:

- ``cafile``: peers are verified against it (servers check client certificates
  only when ``require_client_cert`` is set: mutual TLS);
- ``certfile``/``keyfile``: presented when accepting (required there) and, when
  given, when connecting (the client certificate of mutual TLS).

TLS wraps the TCP stream before any kernelrpc or TVM byte, so with TLS off the
wire formats stay exactly TVM's; with it on, every peer of that service must
speak TLS too. Authentication (``wire.auth``) runs inside the TLS stream when
both are on.

A TLS service tells a peer that speaks plain TCP to it so instead of failing it on
garbage: a TLS ClientHello always starts with the record type 22 (0x16), and no
kernelrpc or TVM opening does, so the service looks at the first byte and answers a
plaintext peer with :data:`PLAINTEXT_REFUSAL` (an ``i32`` like the handshake's
reply codes) and closes. kernelrpc's clients turn it into :class:`TLSError`; TVM's
read a wrong code or magic and stop.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
from typing import TYPE_CHECKING

from ..errors import HandshakeError

if TYPE_CHECKING:
    import ssl

ENV_CA = "KERNELRPC_TLS_CA"
ENV_CERT = "KERNELRPC_TLS_CERT"
ENV_KEY = "KERNELRPC_TLS_KEY"

TLS_REQUIRED = 0xFF2B1
"""The code a TLS service sends, in plain TCP, to a peer that did not start with a TLS hello."""
PLAINTEXT_REFUSAL = struct.pack("<i", TLS_REQUIRED)
TLS_HANDSHAKE_RECORD = 0x16
"""The first byte of every TLS ClientHello."""
HOW_TO_TURN_ON = (f"pass tls=TLSConfig(cafile=...) (or set ${ENV_CA}), or --tls-ca for the command-line "
                  "tools")


class TLSError(HandshakeError):
    """TLS could not be set up with a peer: it does not speak TLS (or requires it), its
    certificate failed verification, or it refused ours. The message says which."""


class TLSConfigError(ValueError):
    """A TLS configuration that cannot work (a missing file, a key without a certificate...)."""


class TLSConfig:
    """A process's part in a TLS fleet (see the module docstring); immutable, checked when made.

    A plain class rather than a dataclass: ``dataclasses`` (with ``inspect`` and ``ast``) would
    add about 10 ms to every client's first ``connect_tracker()``.
    """

    __slots__ = ("cafile", "certfile", "keyfile", "require_client_cert", "check_hostname")

    def __init__(self, cafile: str | None = None, certfile: str | None = None, keyfile: str | None = None,
                 require_client_cert: bool = False, check_hostname: bool = True) -> None:
        for name, path in (("cafile", cafile), ("certfile", certfile), ("keyfile", keyfile)):
            if path is not None and not os.path.isfile(path):
                raise TLSConfigError(f"TLS {name} {path!r} does not exist or is not a file")
        if keyfile and not certfile:
            raise TLSConfigError("a TLS key was given without its certificate (certfile)")
        if require_client_cert and not cafile:
            raise TLSConfigError("requiring client certificates needs a CA bundle (cafile) to check them against")
        for name, value in zip(self.__slots__, (cafile, certfile, keyfile, require_client_cert, check_hostname)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value) -> None:
        raise AttributeError(f"TLSConfig is immutable: cannot set {name}")

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other) -> bool:
        return isinstance(other, TLSConfig) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"TLSConfig({fields})"

    @classmethod
    def from_env(cls) -> TLSConfig | None:
        """The configuration ``$KERNELRPC_TLS_CA``/``_CERT``/``_KEY`` describe, or None."""
        ca, cert, key = (os.environ.get(name) or None for name in (ENV_CA, ENV_CERT, ENV_KEY))
        if not (ca or cert or key):
            return None
        return cls(cafile=ca, certfile=cert, keyfile=key)

    def server_context(self) -> ssl.SSLContext:
        """The context for accepting connections (needs ``certfile``)."""
        import ssl      # here, not at the top: OpenSSL loads only where TLS is used

        if not self.certfile:
            raise TLSConfigError("a service needs a certificate (certfile) to accept TLS connections")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_identity(ctx)
        if self.cafile:
            ctx.load_verify_locations(cafile=self.cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED if self.require_client_cert else ssl.CERT_NONE
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """The context for connecting (the system's CAs when ``cafile`` is not given)."""
        import ssl

        ctx = ssl.create_default_context(cafile=self.cafile)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.check_hostname
        if self.certfile:
            self._load_identity(ctx)
        return ctx

    def _load_identity(self, ctx: ssl.SSLContext) -> None:
        import ssl

        try:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"cannot load the TLS certificate {self.certfile!r} "
                                 f"(key {self.keyfile or 'in the same file'}): {exc}") from exc


def is_tls_hello(first: bytes) -> bool:
    """Whether the first byte a service received starts a TLS handshake."""
    return first[:1] == bytes([TLS_HANDSHAKE_RECORD])


def refuse_plaintext(sock: socket.socket) -> None:
    """Tell a peer that spoke plain TCP to a TLS service so (best effort, never blocking) and close."""
    try:
        sock.setblocking(False)
        sock.send(PLAINTEXT_REFUSAL)
    except OSError:
        pass
    close_gently(sock)


def close_gently(sock: socket.socket) -> None:
    """Close without a reset: a socket closed with unread bytes sends RST, and the peer's
    kernel may then drop what we sent last (the refusal, a TLS alert) before it is read. So
    end our side, take what has arrived (without waiting for more), then close."""
    try:
        sock.setblocking(False)
        sock.shutdown(socket.SHUT_WR)
        for _ in range(16):
            if not sock.recv(65536):
                break
    except (OSError, ValueError):
        pass
    sock.close()


def requires_tls(where: str, how: str = HOW_TO_TURN_ON) -> TLSError:
    return TLSError(f"{where} requires TLS and we connected in plain TCP: {how}")


def check_plaintext_answer(sock: socket.socket, where: str) -> None:
    """Raise :class:`TLSError` if the service at the other end of the plain ``sock`` refused us
    for want of TLS. Looks at the first answer bytes without taking them (``MSG_PEEK``), so the
    bytes that follow on the wire are exactly the protocol's; the socket's timeout bounds it."""
    try:
        head = sock.recv(len(PLAINTEXT_REFUSAL), socket.MSG_PEEK | socket.MSG_WAITALL)
    except socket.timeout:
        raise
    except OSError:
        return      # the protocol's own read reports it
    if head == PLAINTEXT_REFUSAL:
        raise requires_tls(where)


def wrap_client(sock: socket.socket, ctx: ssl.SSLContext, host: str, where: str) -> ssl.SSLSocket:
    """Run the TLS handshake as the connecting side (checking the certificate against ``host``);
    the socket's timeout bounds it. Raises :class:`TLSError` (or ``socket.timeout``)."""
    try:
        return ctx.wrap_socket(sock, server_hostname=host.strip("[]"))
    except socket.timeout:
        raise
    except OSError as exc:
        raise describe_failure(exc, where) from None


_CLIENT_CERT_MISSING = ("CERTIFICATE_REQUIRED", "PEER_DID_NOT_RETURN_A_CERTIFICATE")
_CLIENT_CERT_REFUSED = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "UNSUPPORTED_CERTIFICATE",
                        "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED", "ACCESS_DENIED")
_NOT_TLS = ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
            "HTTP_REQUEST", "UNKNOWN_PROTOCOL")


def refused_after_handshake(where: str) -> TLSError:
    """A service that closes right after a TLS handshake that seemed to succeed refused us
    (TLS 1.3 checks the client's certificate after the client is done, and an asyncio service
    may close without the alert that would say why)."""
    return TLSError(f"{where} closed the connection right after the TLS handshake: it requires a "
                    f"client certificate (mutual TLS) or refused ours; pass tls=TLSConfig(cafile=..., "
                    f"certfile=...) with a certificate its --tls-ca signed, or set ${ENV_CERT}")


def describe_failure(exc: BaseException, where: str) -> TLSError:
    """The :class:`TLSError` for what went wrong when a client set up or used TLS, with what to do."""
    import ssl

    if isinstance(exc, TLSError):
        return exc
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSError(f"{where}: its TLS certificate failed verification: {exc.verify_message or exc}. "
                        "Give the CA that signed it (tls=TLSConfig(cafile=...), --tls-ca, "
                        f"${ENV_CA}); the certificate must name the host you connect to")
    reason = str(getattr(exc, "reason", None) or exc).upper()
    if any(word in reason for word in _CLIENT_CERT_MISSING):
        return TLSError(f"{where} requires a client certificate (mutual TLS): pass "
                        f"tls=TLSConfig(cafile=..., certfile=..., keyfile=...), --tls-cert, or set ${ENV_CERT}")
    if any(word in reason for word in _CLIENT_CERT_REFUSED):
        return TLSError(f"{where} refused our client certificate ({reason.lower()}): it is not signed by a "
                        "CA the service trusts (its --tls-ca)")
    if (isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError, EOFError))
            or any(word in reason for word in _NOT_TLS)):
        return TLSError(f"{where} closed the connection or answered in plain TCP during the TLS handshake: "
                        "it does not speak TLS (started without --tls-cert?; then connect without TLS or "
                        "turn TLS on there), or it refused our client certificate")
    return TLSError(f"{where}: TLS failed: {exc}")


def client_context(tls: TLSConfig | ssl.SSLContext | None = None) -> ssl.SSLContext | None:
    """The ``ssl.SSLContext`` a client connects with: from ``tls`` (a config or a ready context),
    else from ``$KERNELRPC_TLS_*``; None means plain TCP."""
    if tls is None:
        tls = TLSConfig.from_env()
    return tls.client_context() if isinstance(tls, TLSConfig) else tls


def is_tls_socket(sock) -> bool:
    """Whether ``sock`` is an ``ssl.SSLSocket`` (without loading ``ssl`` to find out)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(sock, ssl.SSLSocket)


def is_ssl_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` is an ``ssl.SSLError`` (none can exist where ``ssl`` was never loaded)."""
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(exc, ssl.SSLError)
