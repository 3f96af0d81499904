"""The proxy's link to a tracker: offers every waiting device as a slot (``docs/tvm-wire-formats.md`` section 4.4).

Per connection: magic, then UPDATE_INFO ``{"key": "server:proxy[K1,K2]", "addr": [null,
proxy_port]}`` whenever the set of device keys changes (sent before any PUT, so the
tracker drops our slots if this link closes), then one PUT ``[KEY, [proxy_port,
matchkey], null]`` per waiting device.  Before a PUT, UPDATE_INFO sets ``"protocol"`` to
the session protocol the device named in its key (``-protocol=``; "" for TVM's servers)
when it differs from the last one sent, so kernelrpc's tracker hands each slot only to
clients that speak with that device.  Every ``period`` seconds GET_PENDING_MATCHKEYS
tells which slots the tracker has handed to clients; a device whose key was handed
out but whose client has not come within ``timeout_alloc`` gets a fresh key and a
new PUT, as TVM's proxy does.

The tracker has no "withdraw slot" message.  When a device leaves while its slot is
still offered (it disconnected, timed out, or a client paired with it by KEY
directly), the link reconnects, which makes the tracker drop all our slots, and
offers the devices still waiting under fresh keys.  TVM's proxy leaves such slots
behind; clients then get MISMATCH and retry.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ..errors import AuthenticationError, ProtocolError, TrackerError
from ..rpc.backoff import Backoff
from ..rpc.handshake import parse_key
from ..rpc.auth import (AUTH_CONTEXT, CHALLENGE_HEAD, MAC_BYTES, NONCE_BYTES, PeerAuth,
                        refusal_for_unauthenticated)
from ..rpc.tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode, check_magic, encode_frame
from ..tracker.messages import MAX_PROTOCOL_CHARS
from .pairing import Matchmaker

logger = logging.getLogger(__name__)

MAX_PENDING_KEYS = 100_000


class TrackerLink:
    def __init__(self, addr: tuple[str, int], proxy_port: int, matchmaker: Matchmaker, *,
                 custom_addr: str | None = None, period: float = 2.0, timeout_alloc: float = 5.0, reply_timeout: float = 10.0,
                 max_backoff: float = 30.0, auth_token: bytes | None = None) -> None:
        self.addr = addr
        self.auth_token = auth_token
        self.proxy_port = proxy_port
        self.custom_addr = custom_addr
        self.matchmaker = matchmaker
        self.period = period
        self.timeout_alloc = timeout_alloc
        self.reply_timeout = reply_timeout
        self.max_backoff = max_backoff
        self._wakeup = asyncio.Event()
        self._stale = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._decoder = FrameDecoder()
        self._reported_keys: list[str] | None = None
        self._reported_protocol: str | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        self._wakeup.set()

    def slot_went_stale(self) -> None:
        """A device left while the tracker still offers it; retract at the next poll."""
        self._stale = True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._disconnect()

    # -- connection lifecycle ------------------------------------------------
    async def _run(self) -> None:
        backoff = Backoff(0.5, self.max_backoff)
        while True:
            try:
                await self._connect()
                backoff.reset()
                await self._serve()
                continue  # a deliberate reconnect to retract stale slots
            except (OSError, EOFError, ProtocolError, TrackerError, AuthenticationError,
                    asyncio.TimeoutError) as exc:
                delay = backoff.next()
                logger.warning("tracker %s:%d: %s; reconnecting in %.1fs", *self.addr,
                               exc or type(exc).__name__, delay)
            finally:
                self._disconnect()
            await asyncio.sleep(delay)

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(*self.addr), self.reply_timeout)
        self._decoder = FrameDecoder()
        self._writer.write(MAGIC_BYTES)
        if self.auth_token is not None:
            await asyncio.wait_for(self._authenticate(), self.reply_timeout)
        echo = await asyncio.wait_for(self._reader.readexactly(4), self.reply_timeout)
        if echo == CHALLENGE_HEAD:
            raise refusal_for_unauthenticated(f"tracker {self.addr[0]}:{self.addr[1]}")
        check_magic(echo)
        self._stale = False
        for device in self.matchmaker.devices():
            if device.offered and device.claimed_at is None:
                self.matchmaker.rename(device)
        self._reported_keys = self._reported_protocol = None
        logger.info("registered with tracker %s:%d", *self.addr)

    async def _authenticate(self) -> None:
        auth = PeerAuth(self.auth_token, AUTH_CONTEXT, f"tracker {self.addr[0]}:{self.addr[1]}")
        self._writer.write(auth.feed(await self._reader.readexactly(4 + NONCE_BYTES)))
        auth.feed(await self._reader.readexactly(4))       # a refusal raises here
        auth.feed(await self._reader.readexactly(MAC_BYTES))

    def _disconnect(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def _serve(self) -> None:
        next_poll = time.monotonic() + self.period
        while not self._stale:
            self._wakeup.clear()
            await self._report()
            now = time.monotonic()
            if now >= next_poll:
                await self._poll(now)
                next_poll = now + self.period
                continue
            try:
                await asyncio.wait_for(self._wakeup.wait(), next_poll - now)
            except asyncio.TimeoutError:
                pass
        logger.info("withdrawing slots of devices that left: re-registering with the tracker")

    async def _report(self) -> None:
        keys = self.matchmaker.device_keys()
        info = {"key": "server:proxy[" + ",".join(keys) + "]", "addr": [self.custom_addr, self.proxy_port]}
        if keys != self._reported_keys:
            await self._expect_success([TrackerCode.UPDATE_INFO, info])
            self._reported_keys = keys
        for device in self.matchmaker.devices():
            if not device.offered:
                protocol = parse_key(device.key).options.get("protocol", "")[:MAX_PROTOCOL_CHARS]
                if protocol != self._reported_protocol:
                    await self._expect_success([TrackerCode.UPDATE_INFO, {**info, "protocol": protocol}])
                    self._reported_protocol = protocol
                device.offered = True
                await self._expect_success(
                    [TrackerCode.PUT, device.wanted, [self.proxy_port, device.matchkey],
                     self.custom_addr])
                logger.info("offered %s to the tracker", device.matchkey)

    async def _poll(self, now: float) -> None:
        pending = await self._call([TrackerCode.GET_PENDING_MATCHKEYS])
        if not isinstance(pending, list) or len(pending) > MAX_PENDING_KEYS \
                or not all(isinstance(k, str) for k in pending):
            raise TrackerError(f"GET_PENDING_MATCHKEYS answered {str(pending)[:80]}, not a list of keys")
        pending = set(pending)
        for device in self.matchmaker.devices():
            if not device.offered or device.matchkey in pending:
                continue
            if device.claimed_at is None:
                device.claimed_at = now
            elif now - device.claimed_at > self.timeout_alloc:
                old = device.matchkey
                self.matchmaker.rename(device)
                logger.info("no client came for %s; offering the device as %s", old, device.matchkey)

    # -- request/reply ------------------------------------------------------
    async def _expect_success(self, message) -> None:
        reply = await self._call(message)
        if reply != TrackerCode.SUCCESS:
            raise TrackerError(f"tracker refused {str(message)[:80]}: {str(reply)[:80]}")

    async def _call(self, message):
        self._writer.write(encode_frame(message))
        return await asyncio.wait_for(self._read_message(), self.reply_timeout)

    async def _read_message(self):
        while True:
            chunk = await self._reader.read(65536)
            if not chunk:
                raise EOFError("tracker closed the connection")
            messages = self._decoder.feed(chunk)
            if len(messages) > 1:
                raise ProtocolError("tracker sent more replies than requests")
            if messages:
                return messages[0]
