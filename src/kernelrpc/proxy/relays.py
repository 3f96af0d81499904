"""Which :class:`~.relay.SessionRelay` moves a pair's bytes: decided here, and only here.

``--relay`` picks the relay for plain TCP pairs (:func:`choose_relay`, once at start-up);
the pair itself may need another (:func:`open_relay`): a WebSocket side needs its frames
taken off and put on, a TLS side its records decrypted and encrypted, so those pairs are
relayed by copy whatever ``--relay`` says, and the proxy says so when it starts.
"""
from __future__ import annotations

import logging

from .native_relay import NativeRelay, NativeRelayUnavailable, relay_function
from .relay import BUFFER_BYTES, SPLICE_AVAILABLE, CopyBuffer, PipeBuffer, PumpRelay, SessionRelay, buffer_pair
from .tls import tls_buffers
from .ws_relay import websocket_buffers

logger = logging.getLogger(__name__)

RELAYS = ("auto", "native", "splice", "copy")


class RelayUnavailable(RuntimeError):
    """The relay asked for explicitly cannot run with this configuration."""


def choose_relay(requested: str, *, tls: bool = False) -> str:
    """The relay for plain pairs given ``--relay requested``: ``native``, ``splice``, ``copy``,
    or ``copy (TLS)`` when every TCP peer speaks TLS.

    Raises:
        NativeRelayUnavailable: ``native`` was asked for and cannot run here.
        RelayUnavailable: ``splice`` was asked for and cannot run here, or ``native`` or
            ``splice`` with TLS on.
    """
    if requested not in RELAYS:
        raise ValueError(f"unknown relay {requested!r}")
    if tls:
        if requested in ("native", "splice"):
            raise RelayUnavailable(f"--relay {requested} moves raw bytes and cannot re-encrypt TLS records; "
                                   "with TLS use --relay auto or copy")
        logger.info("TLS is on: every pair is relayed by copy through the TLS layer")
        return "copy (TLS)"
    if requested in ("auto", "native"):
        try:
            relay_function()
            return "native"
        except NativeRelayUnavailable as exc:
            if requested == "native":
                raise
            fallback = "splice" if SPLICE_AVAILABLE else "copy"
            logger.warning("%s; relaying with %s instead", exc, fallback)
            return fallback
    if requested == "splice" and not SPLICE_AVAILABLE:
        raise RelayUnavailable("--relay splice: os.splice is not available here (Linux only); "
                               "use --relay auto or copy")
    return requested


def describe(mode: str, spin_us: float) -> str:
    """``mode`` named first, then what it does: the proxy's start-up line."""
    mib = BUFFER_BYTES >> 20
    how = {"native": f"a C loop, recv/send through {mib} MiB buffers, polling {spin_us:g} us "
                     "after short messages",
           "splice": f"splice(2) through {mib} MiB pipes",
           "copy": f"recv_into/send through {mib} MiB buffers",
           "copy (TLS)": f"recv/decrypt/encrypt/send through {mib} MiB buffers"}
    return f"{mode} ({how[mode]})"


def open_relay(mode: str, loop, a, b, *, to_a: bytes, to_b: bytes, on_close, spin_ns: int = 0) -> SessionRelay:
    """The relay for the paired connections ``a`` and ``b`` (their ``sock``, and the WebSocket
    ``decoder`` or ``tls`` layer a side may have), with ``mode`` from :func:`choose_relay`."""
    def pump(buffers, kind: str) -> PumpRelay:
        return PumpRelay(loop, a.sock, b.sock, to_a, to_b, buffers=buffers, kind=kind, on_close=on_close)

    if a.decoder is not None or b.decoder is not None:
        return pump(websocket_buffers(a.decoder, b.decoder), "copy (WebSocket)")
    if a.tls is not None or b.tls is not None:
        return pump(tls_buffers(a.tls, b.tls), "copy (TLS)")
    if mode == "native":
        return NativeRelay(loop, a.sock, b.sock, to_a, to_b, spin_ns=spin_ns, on_close=on_close)
    if mode == "splice":
        return pump(buffer_pair(PipeBuffer), "splice")
    return pump(buffer_pair(CopyBuffer), "copy")
