"""The device server's driver for the tracker-registration state machine.

:mod:`kernelrpc.wire.registration` decides what to send and when; this module owns the
non-blocking socket.  The socket sits in the server listener's selector (:meth:`attach`):
connect completion and tracker replies wake the server's loop, and the loop calls
:meth:`tick` when :meth:`next_deadline` passes, so a silent tracker costs no wake-ups
between polls.  Without an attached selector (a registration on its own, as in tests)
:meth:`tick` also collects the socket's events from a private selector.  With ``tls`` (a
client-side context) the TLS handshake runs, non-blocking, between the TCP connect and the
machine's ``Connected``, so the machine's connect deadline bounds it too.
"""
from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import ssl
import time

from ..wire import registration as R
from ..wire.backoff import Backoff
from ..wire.tls import PLAINTEXT_REFUSAL, describe_failure, requires_tls
from ..runtime import device_info

log = logging.getLogger(__name__)


class TrackerRegistration:
    """Keeps one server registered at a tracker under ``key``; see :mod:`kernelrpc.wire.registration`."""

    def __init__(self, tracker_addr: tuple[str, int], key: str, port: int,
                 custom_addr: str | None = None, *, poll_interval: float = 2.0,
                 auth_token: bytes | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.tracker_addr = (tracker_addr[0], int(tracker_addr[1]))
        self._tls = tls
        self.machine = R.Registration(key, port, custom_addr, where=self.where, poll_interval=poll_interval,
                                      auth_token=auth_token, device=device_info.describe(),
                                      backoff=Backoff(0.25, 10.0), now=time.monotonic(), logger=log)
        self._sock: socket.socket | None = None
        self._selector: selectors.BaseSelector = selectors.DefaultSelector()
        self._own_selector = True

    @property
    def where(self) -> str:
        return f"{self.tracker_addr[0]}:{self.tracker_addr[1]}"

    @property
    def matchkey(self) -> str | None:
        return self.machine.matchkey

    @property
    def registered(self) -> bool:
        return self.machine.registered

    @property
    def state(self) -> R.State:
        return self.machine.state

    def attach(self, selector: selectors.BaseSelector) -> None:
        """Use the server's selector for the tracker socket from now on."""
        if self._sock is not None:
            self._selector.unregister(self._sock)
            selector.register(self._sock, self._events(), self._on_ready)
        if self._own_selector:
            self._selector.close()
        self._selector, self._own_selector = selector, False

    # -- loop interface ---------------------------------------------------------------------
    def next_deadline(self) -> float:
        return self.machine.deadline

    def tick(self) -> None:
        if self._own_selector and self._sock is not None:
            for key, _ in self._selector.select(0):
                key.data(key.fileobj)
        if time.monotonic() >= self.machine.deadline:
            self._handle(R.TimerFired())

    def session_started(self) -> None:
        self._handle(R.SessionStarted())

    def session_finished(self) -> None:
        self._handle(R.SessionFinished())

    def close(self) -> None:
        self.machine.close()
        self._close_socket()
        if self._own_selector:
            self._selector.close()

    # -- events and actions -----------------------------------------------------------------
    def _handle(self, event) -> None:
        for action in self.machine.handle(event, time.monotonic()):
            if isinstance(action, R.Send):
                try:
                    self._sock.sendall(action.data)   # short frames into a send buffer that is drained
                except OSError as exc:
                    self._handle(R.ConnectionClosed(str(exc) or type(exc).__name__))
                    return
            elif isinstance(action, R.Connect):
                self._connect()
            elif isinstance(action, R.Disconnect):
                self._close_socket()

    def _connect(self) -> None:
        family = socket.AF_INET6 if ":" in self.tracker_addr[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        err = sock.connect_ex(self.tracker_addr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            self._handle(R.ConnectionClosed(f"cannot connect: {os.strerror(err)}"))
            return
        self._selector.register(sock, selectors.EVENT_WRITE, self._on_ready)

    def _events(self) -> int:
        return selectors.EVENT_WRITE if self.machine.state is R.State.CONNECTING else selectors.EVENT_READ

    def _on_ready(self, sock: socket.socket) -> None:
        if self.machine.state is R.State.CONNECTING:
            if not isinstance(sock, ssl.SSLSocket):
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._handle(R.ConnectionClosed(os.strerror(err)))
                    return
                if self._tls is not None:
                    try:
                        sock = self._start_tls(sock)
                    except OSError as exc:     # the tracker went away between connect and wrap
                        self._handle(R.ConnectionClosed(str(exc) or type(exc).__name__))
                        return
            if isinstance(sock, ssl.SSLSocket) and not self._tls_handshake(sock):
                return
            self._selector.modify(sock, selectors.EVENT_READ, self._on_ready)
            self._handle(R.Connected(sock.getsockname()[0]))
            return
        while self._sock is sock:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:
                if isinstance(exc, ssl.SSLError):
                    exc = describe_failure(exc, f"tracker {self.where}")
                self._handle(R.ConnectionClosed(str(exc) or type(exc).__name__))
                return
            if data[:len(PLAINTEXT_REFUSAL)] == PLAINTEXT_REFUSAL and not isinstance(sock, ssl.SSLSocket):
                self._handle(R.ConnectionClosed(str(requires_tls(
                    f"tracker {self.where}", "start this server with --tls-ca (and --tls-cert)"))))
                return
            self._handle(R.DataReceived(data) if data else R.ConnectionClosed())
            # TLS may hold more decrypted bytes than the socket shows the selector
            if not (data and isinstance(sock, ssl.SSLSocket) and sock.pending()):
                return

    def _start_tls(self, sock: socket.socket) -> ssl.SSLSocket:
        self._selector.unregister(sock)
        try:
            tls = self._tls.wrap_socket(sock, server_hostname=self.tracker_addr[0], do_handshake_on_connect=False)
        except OSError:
            self._sock = None
            sock.close()
            raise
        self._sock = tls
        self._selector.register(tls, selectors.EVENT_READ, self._on_ready)
        return tls

    def _tls_handshake(self, sock: ssl.SSLSocket) -> bool:
        """One step of the TLS handshake; True once it is done."""
        try:
            sock.do_handshake()
            return True
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, self._on_ready)
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, self._on_ready)
        except OSError as exc:
            self._handle(R.ConnectionClosed(str(describe_failure(exc, f"tracker {self.where}"))))
        return False

    def _close_socket(self) -> None:
        if self._sock is not None:
            try:
                self._selector.unregister(self._sock)
            except (KeyError, ValueError):
                pass
            self._sock.close()
            self._sock = None
