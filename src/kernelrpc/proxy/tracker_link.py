"""The proxy's link to a tracker: the asyncio driver of :class:`~kernelrpc.wire.registration.ProxyRegistration`.

The machine decides what to send and when (every waiting device one slot, see
``docs/proxy.md``, "With a tracker"); this module owns the connection (plain TCP, or TLS
when the proxy has a TLS configuration) and the one timer, and tells the machine about
devices that start or stop waiting.  The machine owns the offers' states
(:class:`~kernelrpc.wire.registration.OfferState`); the proxy asks it, never stores them.
"""
from __future__ import annotations

import asyncio
import logging
import ssl

from ..wire import device_record
from ..wire import registration as R
from ..wire.handshake import parse_key
from ..wire.tracker_codec import MAX_PROTOCOL_CHARS
from .pairing import Matchmaker, Waiter

logger = logging.getLogger(__name__)


class _Stream(asyncio.Protocol):
    """One connection to the tracker; reports to the link only while it is the current one."""

    def __init__(self, link: TrackerLink) -> None:
        self.link = link
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.link.stream is self:
            self.link.handle(R.DataReceived(data))

    def connection_lost(self, exc) -> None:
        if self.link.stream is self:
            self.link.stream = None
            self.link.handle(R.ConnectionClosed(str(exc) if exc else "the tracker closed the connection"))


class TrackerLink:
    """Keeps every waiting device of ``matchmaker`` offered at the tracker ``addr``."""

    def __init__(self, addr: tuple[str, int], proxy_port: int, matchmaker: Matchmaker, *,
                 custom_addr: str | None = None, poll_interval: float = 2.0,
                 auth_token: bytes | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.addr = addr
        self.ssl_context = ssl_context
        self._loop: asyncio.AbstractEventLoop | None = None
        self.machine = R.ProxyRegistration(
            proxy_port, custom_addr, where=f"{addr[0]}:{addr[1]}", poll_interval=poll_interval,
            auth_token=auth_token, rekey=matchmaker.rename, logger=logger)
        self.stream: _Stream | None = None
        self._connecting: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    # -- what the proxy tells the link ------------------------------------------------------
    def device_waiting(self, device: Waiter) -> None:
        options = parse_key(device.key).options
        protocol = options.get("protocol", "")[:MAX_PROTOCOL_CHARS]
        self.handle(R.OfferAdded(device, device.wanted, device.matchkey, protocol,
                                 self._device_record(device, options.get(device_record.OPTION))))

    @staticmethod
    def _device_record(device: Waiter, value: str | None) -> dict | None:
        """The device's checked ``-device=`` record; None (logged) if it sent none or a bad one."""
        if value is None:
            return None
        try:
            record, unknown = device_record.decode(value)
        except device_record.BadRecord as exc:
            logger.warning("device %s (key %r): %s; offered to the tracker without a device record",
                           device.handle.name, device.wanted, exc)
            return None
        if unknown:
            logger.info("device %s (key %r): device record fields %s are unknown here; left out",
                        device.handle.name, device.wanted, ", ".join(unknown))
        return record

    def device_gone(self, device: Waiter, handed_out: bool = False) -> None:
        """``device`` stopped waiting; ``handed_out``: its client came with its match key."""
        self.handle(R.OfferWithdrawn(device, handed_out))

    def offer_state(self, device: Waiter) -> R.OfferState | None:
        return self.machine.offer_state(device)

    async def close(self) -> None:
        self.machine.close()
        if self._timer is not None:
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
            try:
                await self._connecting
            except (asyncio.CancelledError, OSError):
                pass
        self._drop_stream()

    # -- the machine's events and actions ---------------------------------------------------
    def handle(self, event) -> None:
        for action in self.machine.handle(event, self._loop.time()):
            if isinstance(action, R.Send):
                if self.stream is not None and self.stream.transport is not None:
                    self.stream.transport.write(action.data)
            elif isinstance(action, R.Connect):
                self._connecting = self._loop.create_task(self._connect())
            elif isinstance(action, R.Disconnect):
                self._drop_stream()
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.machine.deadline != float("inf"):
            self._timer = self._loop.call_at(self.machine.deadline, self.handle, R.TimerFired())

    async def _connect(self) -> None:
        stream = _Stream(self)
        host, port = self.addr
        try:
            transport, _ = await self._loop.create_connection(
                lambda: stream, host, port, ssl=self.ssl_context,
                server_hostname=host if self.ssl_context is not None else None)
        except asyncio.CancelledError:
            raise
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._connecting = None
            self.handle(R.ConnectionClosed(f"cannot connect: {exc}"))
            return
        self._connecting = None
        if self.machine.state is not R.State.CONNECTING:     # the machine gave up meanwhile
            transport.abort()
            return
        self.stream = stream
        local = transport.get_extra_info("sockname")
        self.handle(R.Connected(local[0] if local else ""))

    def _drop_stream(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        stream, self.stream = self.stream, None
        if stream is not None and stream.transport is not None:
            stream.transport.abort()
