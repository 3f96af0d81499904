"""The proxy's end of TLS peers, sans-IO over ``ssl.MemoryBIO``: it terminates TLS on both sides.

A TLS peer's socket stays a plain non-blocking socket driven by the proxy's own reader
callbacks (as every peer's is); a :class:`TLSLayer` turns the raw bytes read from it into
plaintext and the proxy's plaintext into records for it.  Before pairing,
:class:`~.connection.PeerConnection` reads the handshake and the key through it; after
pairing, :class:`TLSBuffer` does the same inside :class:`~.relay.PumpRelay` (splice and the
native loop move raw bytes and cannot re-encrypt, so TLS pairs are always relayed by copy:
``copy (TLS)``).  The standard library's ``ssl`` does the cryptography; ``SSLObject`` is its
sans-IO interface, which fits sockets the proxy reads itself (asyncio's TLS transports would
own them).
"""
from __future__ import annotations

import socket
import ssl

from .relay import QueuedBuffer

_READ_CHUNK = 256 << 10   # raw bytes read at most at once in the relay
_MAX_RECORD = 16384 + 2048   # a TLS record's plaintext, and then some


class TLSLayer:
    """One peer's TLS session (server side): raw bytes in, plaintext out, and back."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._plain = bytearray(0)   # decrypted bytes, reused from read to read
        self.handshake_done = False
        self.closed = False   # the peer ended TLS (close_notify)

    def receive(self, raw: bytes) -> memoryview:
        """Feed bytes read from the peer; returns the plaintext they complete (a view valid
        until the next call).

        Raises:
            ssl.SSLError: a certificate the context refuses, a broken record.
        """
        self._incoming.write(raw)
        if not self.handshake_done:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return memoryview(b"")
            self.handshake_done = True
        # Plaintext is never longer than the records it comes from: those in the BIO, the one
        # being decrypted, and at most one partial record OpenSSL holds back.
        need = self._incoming.pending + self._tls.pending() + _MAX_RECORD
        if need > len(self._plain):
            self._plain = bytearray(need)
        view = memoryview(self._plain)
        n = 0
        more = []          # only if the bound above were wrong: plaintext must never stay behind
        while True:
            try:
                if n < len(view):
                    got = self._tls.read(len(view) - n, view[n:])
                else:
                    got = len(chunk := self._tls.read(_MAX_RECORD))
                    more.append(chunk)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            if not got:
                break
            if not more:
                n += got
        return view[:n] if not more else memoryview(bytes(view[:n]) + b"".join(more))

    def send(self, plaintext: bytes) -> None:
        """Queue ``plaintext`` as records (see :meth:`take`)."""
        if plaintext:
            self._tls.write(plaintext)

    def finish(self) -> None:
        """Queue a close_notify."""
        try:
            self._tls.unwrap()
        except (ssl.SSLError, ValueError):
            pass

    @property
    def pending(self) -> int:
        """Bytes of records waiting to go to the peer."""
        return self._outgoing.pending

    def take(self) -> bytes:
        """The records to send to the peer (handshake replies too), now."""
        return self._outgoing.read()


class TLSBuffer(QueuedBuffer):
    """One direction ``src -> dst`` of a pair with a TLS side: decrypt from ``src`` (if its
    layer is given), encrypt for ``dst`` (likewise), with :class:`~.relay.CopyBuffer`'s bound.

    ``dst``'s layer may also hold records that reading from ``dst`` produced (TLS answers a
    peer on the same session): they count as pending here, so the relay sends them.
    """

    def __init__(self, src_tls: TLSLayer | None, dst_tls: TLSLayer | None) -> None:
        super().__init__()
        self._src_tls = src_tls
        self._dst_tls = dst_tls
        self.src_closed = False

    @property
    def pending(self) -> int:
        return self.queued + (self._dst_tls.pending if self._dst_tls else 0)

    def _room(self) -> int:
        """Raw bytes we may read: what they become must fit (records add under 1/16)."""
        free = self.capacity - self.pending
        return min(_READ_CHUNK, free - free // 16 - 1024)

    @property
    def full(self) -> bool:
        return self._room() <= 0

    def put(self, data: bytes) -> None:
        if self._dst_tls is not None:
            self._dst_tls.send(data)
        else:
            self._out += data

    def fill(self, src: socket.socket) -> int | None:
        if self.src_closed:
            return 0
        room = self._room()
        if room <= 0:
            return None
        try:
            raw = src.recv(room)
        except BlockingIOError:
            return None
        if not raw:
            return 0
        if self._src_tls is None:
            self.put(raw)
        else:
            self.put(self._src_tls.receive(raw))   # ssl.SSLError (an OSError) ends the pair
            self.src_closed = self._src_tls.closed
        return len(raw)

    def drain(self, dst: socket.socket) -> None:
        if self._dst_tls is not None and self._dst_tls.pending:
            records = self._dst_tls.take()
            if self._out:
                self._out += records
            else:                     # the usual case: straight to the socket, keep the rest
                try:
                    sent = dst.send(records)
                except BlockingIOError:
                    sent = 0
                self._out += memoryview(records)[sent:]
        self.send_queued(dst)

    def farewell(self, dst: socket.socket) -> None:
        """When the pair ends: what is buffered, then a close_notify to a TLS ``dst``."""
        try:
            if self._dst_tls is not None:
                self._dst_tls.finish()
            self.drain(dst)
        except OSError:
            pass


def tls_buffers(a_tls: TLSLayer | None, b_tls: TLSLayer | None) -> tuple[TLSBuffer, TLSBuffer]:
    """The (a -> b, b -> a) buffers for a pair; a side with a layer speaks TLS."""
    return TLSBuffer(a_tls, b_tls), TLSBuffer(b_tls, a_tls)
