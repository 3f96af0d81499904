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
speak TLS too. Authentication (``rpc.auth``) runs inside the TLS stream when
both are on.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

ENV_CA = "KERNELRPC_TLS_CA"
ENV_CERT = "KERNELRPC_TLS_CERT"
ENV_KEY = "KERNELRPC_TLS_KEY"


class TLSConfigError(ValueError):
    """A TLS configuration that cannot work (a missing file, a key without a certificate...)."""


@dataclass(frozen=True)
class TLSConfig:
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    require_client_cert: bool = False
    check_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("cafile", "certfile", "keyfile"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise TLSConfigError(f"TLS {name} {path!r} does not exist or is not a file")
        if self.keyfile and not self.certfile:
            raise TLSConfigError("a TLS key was given without its certificate (certfile)")
        if self.require_client_cert and not self.cafile:
            raise TLSConfigError("requiring client certificates needs a CA bundle (cafile) to check them against")

    @classmethod
    def from_env(cls) -> TLSConfig | None:
        """The configuration ``$KERNELRPC_TLS_CA``/``_CERT``/``_KEY`` describe, or None."""
        ca, cert, key = (os.environ.get(name) or None for name in (ENV_CA, ENV_CERT, ENV_KEY))
        if not (ca or cert or key):
            return None
        return cls(cafile=ca, certfile=cert, keyfile=key)

    def server_context(self) -> ssl.SSLContext:
        """The context for accepting connections (needs ``certfile``)."""
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
        ctx = ssl.create_default_context(cafile=self.cafile)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.check_hostname
        if self.certfile:
            self._load_identity(ctx)
        return ctx

    def _load_identity(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"cannot load the TLS certificate {self.certfile!r} "
                                 f"(key {self.keyfile or 'in the same file'}): {exc}") from exc


def client_context(tls: TLSConfig | ssl.SSLContext | None = None) -> ssl.SSLContext | None:
    """The ``ssl.SSLContext`` a client connects with: from ``tls`` (a config or a ready context),
    else from ``$KERNELRPC_TLS_*``; None means plain TCP."""
    if tls is None:
        tls = TLSConfig.from_env()
    if tls is None or isinstance(tls, ssl.SSLContext):
        return tls
    return tls.client_context()
