"""The relay loop in native code: one thread per paired session, no interpreter on the path.

On loopback a Python relay costs two event-loop wake-ups and a few dozen
bytecodes per message; at session round trips of ~20 us that is most of the
proxy's overhead.  This module runs the loop over ``recv``/``send``/``poll`` in C
(``native_relay.c``, compiled by the host's C compiler as the module runtime is:
``native_loop.py``) in a thread through ``ctypes``, which releases the GIL for the
whole session.

After it has relayed a short message (a request or a reply) the loop keeps
polling its two sockets for up to ``spin_ns`` before it sleeps in ``poll(2)``:
the answer usually follows within microseconds, and catching it without a
sleep and a wake-up is what brings the round trip down.  Bulk reads do not
start the window (a copy must not lose a core to a polling proxy), and an idle
session sleeps and costs no CPU.

Each direction has a fixed buffer (``BUFFER_BYTES``): a direction stops reading
while it holds bytes its destination has not taken, so a slow reader costs one
buffer per direction and stops the writer through TCP's own flow control.
When either side ends (EOF or error) whatever that side sent has already been
delivered, and both sockets are closed, as TVM's proxy does.
"""
from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import logging
import mmap
import os
import socket
import struct
import sys
import threading

from .relay import BUFFER_BYTES

logger = logging.getLogger(__name__)


class NativeRelayUnavailable(RuntimeError):
    """The native relay cannot run here: not 64-bit Linux, or no C compiler is installed."""


@functools.lru_cache(maxsize=1)
def relay_function():
    """The relay loop (``native_loop.py``) compiled for this host and loaded, once a process.

    Raises:
        NativeRelayUnavailable: the platform cannot run it, or there is no C compiler (the
            only failures a caller may turn into a fallback).  Anything else -- the compiler
            rejecting the source, a failed link -- is raised as it is (a ToolchainError).
    """
    if not sys.platform.startswith("linux") or struct.calcsize("P") != 8:
        raise NativeRelayUnavailable("the native relay needs 64-bit Linux")
    from ..deploy.toolchain import Toolchain, ToolchainError, find_host_cc
    from .native_loop import compile_relay

    try:
        argv = tuple(find_host_cc())
    except ToolchainError as exc:
        raise NativeRelayUnavailable(f"the native relay needs a C compiler: {exc}") from None
    return compile_relay(Toolchain(os.path.basename(argv[0]), argv))


class NativeRelay:
    """One paired session relayed by :func:`relay_function` in a thread of its own
    (a :class:`~.relay.SessionRelay`).

    :meth:`close` only asks the loop to stop; the sockets are closed on the event
    loop once the thread has returned, so no descriptor is closed (and reused)
    while native code may still use it.
    """

    kind = "native"

    def __init__(self, loop, a: socket.socket, b: socket.socket, to_a: bytes, to_b: bytes,
                 spin_ns: int = 0, on_close=None) -> None:
        if max(len(to_a), len(to_b)) > BUFFER_BYTES:
            raise ValueError("pairing replies larger than the relay buffer")
        self._function = relay_function()
        self._loop = loop
        self._socks = (a, b)
        self._queued = (len(to_b), len(to_a))
        # Anonymous mappings: pages are committed only as far as a session's data reaches.
        self._maps = (mmap.mmap(-1, BUFFER_BYTES), mmap.mmap(-1, BUFFER_BYTES))
        self._maps[0][:len(to_b)] = to_b
        self._maps[1][:len(to_a)] = to_a
        self._buffers = tuple(ctypes.c_char.from_buffer(m) for m in self._maps)
        self._spin_ns = spin_ns
        self._on_close = on_close
        self._stop_flag = ctypes.c_int32(0)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._stopping = False
        self._closed = loop.create_future()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self.result: tuple[int, int, int] | None = None  # return code, bytes from a, from b

    @property
    def bytes_moved(self) -> tuple[int, int]:
        """Known once the loop has returned (it writes its counts at exit); (0, 0) before."""
        return (0, 0) if self.result is None else self.result[1:]

    def start(self) -> None:
        try:
            self._thread.start()
        except RuntimeError as exc:  # the process is out of threads: drop this session only
            logger.error("cannot start a relay thread: %s", exc)
            self.result = (-errno.EAGAIN, 0, 0)
            self._finish()

    def close(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._stop_flag.value = 1  # seen by a loop that is busy or polling
            os.write(self._stop_w, b"x")  # ends a loop asleep in poll()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def _run(self) -> None:
        moved = (ctypes.c_int64 * 2)()
        a, b = self._socks
        rc = self._function(
            a=a.fileno(), b=b.fileno(), buf_ab=ctypes.addressof(self._buffers[0]),
            buf_ba=ctypes.addressof(self._buffers[1]), cap=BUFFER_BYTES,
            pend_ab=self._queued[0], pend_ba=self._queued[1], stop_fd=self._stop_r,
            stop_flag=ctypes.addressof(self._stop_flag), spin_ns=self._spin_ns,
            moved=ctypes.addressof(moved))
        self.result = (rc, moved[0], moved[1])
        try:
            self._loop.call_soon_threadsafe(self._finish)
        except RuntimeError:  # the event loop is gone: the process is exiting
            pass

    def _finish(self) -> None:
        self._stopping = True  # the stop pipe is closed below
        rc, from_a, from_b = self.result
        if rc < 0:
            logger.debug("relay ended on %s after %d/%d bytes", errno.errorcode.get(-rc, -rc),
                         from_a, from_b)
        for sock in self._socks:
            sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
        self._buffers = ()
        for buffer in self._maps:
            buffer.close()
        self._closed.set_result(None)
        if self._on_close is not None:
            self._on_close()
