"""The relay loop in native code: one thread per paired session, no interpreter on the path.

On loopback a Python relay costs two event-loop wake-ups and a few dozen
bytecodes per message; at session round trips of ~20 us that is most of the
proxy's overhead.  This module JIT-compiles (with llvmlite, already a dependency)
a small loop over ``recv``/``send``/``poll`` and runs it in a thread through
``ctypes``, which releases the GIL for the whole session.

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
import select
import socket
import struct
import sys
import threading
import time

from .relay import BUFFER_BYTES

logger = logging.getLogger(__name__)

#: Reads shorter than this look like requests and replies and (re)start the polling
#: window; bulk transfers do not, so they do not take a core from the peers.
SHORT_READ_BYTES = 16 << 10
STOPPED = 1  # return value: stopped by NativeRelay.close()
_CLOCK_MONOTONIC = time.CLOCK_MONOTONIC

_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)


def _relay_ir(pause_decl: str, pause: str) -> str:
    """LLVM IR text of ``kernelrpc_relay``; constants come from this platform's headers via Python."""
    dontwait = socket.MSG_DONTWAIT
    nosignal = getattr(socket, "MSG_NOSIGNAL", 0)
    return f"""
{pause_decl}
declare i64 @recv(i32, ptr, i64, i32)
declare i64 @send(i32, ptr, i64, i32)
declare i32 @poll(ptr, i64, i32)
declare ptr @__errno_location()
declare i32 @clock_gettime(i32, ptr)

; one direction: bytes [start, end) of buf are still to be sent to dst
%Dir = type {{ i32, i32, ptr, i64, i64, i64, i32, i64 }}  ; src dst buf start end cap eof moved
%PollFd = type {{ i32, i16, i16 }}

define internal i64 @now_ns() {{
  %t = alloca [2 x i64], align 8
  %rc = call i32 @clock_gettime(i32 {_CLOCK_MONOTONIC}, ptr %t)
  %sp = getelementptr [2 x i64], ptr %t, i32 0, i32 0
  %np = getelementptr [2 x i64], ptr %t, i32 0, i32 1
  %s = load i64, ptr %sp
  %n = load i64, ptr %np
  %sn = mul i64 %s, 1000000000
  %r = add i64 %sn, %n
  ret i64 %r
}}

define internal i32 @errno_now() {{
  %p = call ptr @__errno_location()
  %e = load i32, ptr %p
  ret i32 %e
}}

; <0: -errno; else flags: 1 moved bytes or saw EOF, 2 read a short message (0: nothing to do)
define internal i32 @pump(ptr %d) {{
entry:
  %srcp = getelementptr %Dir, ptr %d, i32 0, i32 0
  %dstp = getelementptr %Dir, ptr %d, i32 0, i32 1
  %bufp = getelementptr %Dir, ptr %d, i32 0, i32 2
  %startp = getelementptr %Dir, ptr %d, i32 0, i32 3
  %endp = getelementptr %Dir, ptr %d, i32 0, i32 4
  %capp = getelementptr %Dir, ptr %d, i32 0, i32 5
  %eofp = getelementptr %Dir, ptr %d, i32 0, i32 6
  %movedp = getelementptr %Dir, ptr %d, i32 0, i32 7
  %src = load i32, ptr %srcp
  %dst = load i32, ptr %dstp
  %buf = load ptr, ptr %bufp
  %start0 = load i64, ptr %startp
  %end0 = load i64, ptr %endp
  %eof = load i32, ptr %eofp
  %empty = icmp eq i64 %start0, %end0
  %open = icmp eq i32 %eof, 0
  %canread = and i1 %empty, %open
  br i1 %canread, label %read, label %write

read:
  %cap = load i64, ptr %capp
  %n = call i64 @recv(i32 %src, ptr %buf, i64 %cap, i32 {dontwait})
  %got = icmp sgt i64 %n, 0
  br i1 %got, label %gotdata, label %notdata
gotdata:
  store i64 0, ptr %startp
  store i64 %n, ptr %endp
  %moved0 = load i64, ptr %movedp
  %moved1 = add i64 %moved0, %n
  store i64 %moved1, ptr %movedp
  %short = icmp slt i64 %n, {SHORT_READ_BYTES}
  %readflags = select i1 %short, i32 3, i32 1
  br label %write
notdata:
  %closed = icmp eq i64 %n, 0
  br i1 %closed, label %sawEOF, label %readerr
sawEOF:
  store i32 1, ptr %eofp
  ret i32 1
readerr:
  %re = call i32 @errno_now()
  %rretry = call i1 @retry(i32 %re)
  br i1 %rretry, label %nothing, label %fail_read
nothing:
  ret i32 0
fail_read:
  %rneg = sub i32 0, %re
  ret i32 %rneg

write:
  %progress = phi i32 [ 0, %entry ], [ %readflags, %gotdata ], [ %sentflags, %sent ]
  %s = load i64, ptr %startp
  %e = load i64, ptr %endp
  %done = icmp eq i64 %s, %e
  br i1 %done, label %drained, label %dosend
dosend:
  %from = getelementptr i8, ptr %buf, i64 %s
  %len = sub i64 %e, %s
  %w = call i64 @send(i32 %dst, ptr %from, i64 %len, i32 {dontwait | nosignal})
  %wrote = icmp sgt i64 %w, 0
  br i1 %wrote, label %sent, label %senderr
sent:
  %s2 = add i64 %s, %w
  store i64 %s2, ptr %startp
  %sentflags = or i32 %progress, 1
  br label %write
senderr:
  %we = call i32 @errno_now()
  %wretry = call i1 @retry(i32 %we)
  br i1 %wretry, label %blocked, label %fail_write
blocked:
  ret i32 %progress
fail_write:
  %wneg = sub i32 0, %we
  ret i32 %wneg
drained:
  store i64 0, ptr %startp
  store i64 0, ptr %endp
  ret i32 %progress
}}

define internal i1 @retry(i32 %e) {{
  %again = icmp eq i32 %e, {errno.EAGAIN}
  %block = icmp eq i32 %e, {errno.EWOULDBLOCK}
  %intr = icmp eq i32 %e, {errno.EINTR}
  %a = or i1 %again, %block
  %r = or i1 %a, %intr
  ret i1 %r
}}

; ended: EOF seen and everything read before it delivered
define internal i1 @ended(ptr %d) {{
  %eofp = getelementptr %Dir, ptr %d, i32 0, i32 6
  %startp = getelementptr %Dir, ptr %d, i32 0, i32 3
  %endp = getelementptr %Dir, ptr %d, i32 0, i32 4
  %eof = load i32, ptr %eofp
  %s = load i64, ptr %startp
  %e = load i64, ptr %endp
  %isEOF = icmp ne i32 %eof, 0
  %empty = icmp eq i64 %s, %e
  %r = and i1 %isEOF, %empty
  ret i1 %r
}}

; poll events for a socket that is the source of `in` and the destination of `out`
define internal i16 @events(ptr %in, ptr %out) {{
  %eofp = getelementptr %Dir, ptr %in, i32 0, i32 6
  %eof = load i32, ptr %eofp
  %startp = getelementptr %Dir, ptr %in, i32 0, i32 3
  %endp = getelementptr %Dir, ptr %in, i32 0, i32 4
  %s = load i64, ptr %startp
  %e = load i64, ptr %endp
  %open = icmp eq i32 %eof, 0
  %empty = icmp eq i64 %s, %e
  %readable = and i1 %open, %empty
  %rbits = select i1 %readable, i16 {select.POLLIN}, i16 0
  %ostartp = getelementptr %Dir, ptr %out, i32 0, i32 3
  %oendp = getelementptr %Dir, ptr %out, i32 0, i32 4
  %os = load i64, ptr %ostartp
  %oe = load i64, ptr %oendp
  %pending = icmp ne i64 %os, %oe
  %wbits = select i1 %pending, i16 {select.POLLOUT}, i16 0
  %r = or i16 %rbits, %wbits
  ret i16 %r
}}

define internal void @set_pollfd(ptr %fds, i32 %i, i32 %fd, i16 %ev) {{
  %fdp = getelementptr [3 x %PollFd], ptr %fds, i32 0, i32 %i, i32 0
  %evp = getelementptr [3 x %PollFd], ptr %fds, i32 0, i32 %i, i32 1
  %revp = getelementptr [3 x %PollFd], ptr %fds, i32 0, i32 %i, i32 2
  store i32 %fd, ptr %fdp
  store i16 %ev, ptr %evp
  store i16 0, ptr %revp
  ret void
}}

; Relays between sockets a and b until one side ends (returns 0), it is told to
; stop ({STOPPED}: *stop_flag set, and the stop descriptor made readable to end a
; poll) or a socket fails (-errno).  buf_ab holds
; pend_ab bytes already queued for b (the pairing reply), buf_ba likewise for a.
; moved[0], moved[1]: bytes read from a and from b.
define i64 @kernelrpc_relay(i32 %a, i32 %b, ptr %buf_ab, ptr %buf_ba, i64 %cap, i64 %pend_ab,
                            i64 %pend_ba, i32 %stop, ptr %stop_flag, i64 %spin_ns, ptr %moved) {{
entry:
  %ab = alloca %Dir, align 8
  %ba = alloca %Dir, align 8
  %fds = alloca [3 x %PollFd], align 8
  store %Dir {{ i32 0, i32 0, ptr null, i64 0, i64 0, i64 0, i32 0, i64 0 }}, ptr %ab
  store %Dir {{ i32 0, i32 0, ptr null, i64 0, i64 0, i64 0, i32 0, i64 0 }}, ptr %ba
  call void @init_dir(ptr %ab, i32 %a, i32 %b, ptr %buf_ab, i64 %pend_ab, i64 %cap)
  call void @init_dir(ptr %ba, i32 %b, i32 %a, ptr %buf_ba, i64 %pend_ba, i64 %cap)
  %t0 = call i64 @now_ns()
  br label %loop

loop:
  %last = phi i64 [ %t0, %entry ], [ %tp, %talking ], [ %last, %checkshort ], [ %last, %spin ],
                 [ %last, %woke ]
  %halt = load atomic i32, ptr %stop_flag monotonic, align 4
  %halted = icmp ne i32 %halt, 0
  br i1 %halted, label %stopping, label %work
work:
  %p1 = call i32 @pump(ptr %ab)
  %p2 = call i32 @pump(ptr %ba)
  %e1 = icmp slt i32 %p1, 0
  %e2 = icmp slt i32 %p2, 0
  %either = or i1 %e1, %e2
  br i1 %either, label %failed, label %checkend
failed:
  %err = select i1 %e1, i32 %p1, i32 %p2
  %err64 = sext i32 %err to i64
  br label %finish
checkend:
  %end1 = call i1 @ended(ptr %ab)
  %end2 = call i1 @ended(ptr %ba)
  %over = or i1 %end1, %end2
  br i1 %over, label %ended, label %checkmove
ended:
  br label %finish
checkmove:
  %p12 = or i32 %p1, %p2
  %moved_now = icmp ne i32 %p12, 0
  br i1 %moved_now, label %checkshort, label %quiet
checkshort:
  %shortbit = and i32 %p12, 2
  %isshort = icmp ne i32 %shortbit, 0
  br i1 %isshort, label %talking, label %loop
talking:
  %tp = call i64 @now_ns()
  br label %loop
quiet:
  %tq = call i64 @now_ns()
  %since = sub i64 %tq, %last
  %recent = icmp slt i64 %since, %spin_ns
  br i1 %recent, label %spin, label %sleep
spin:
  {pause}
  br label %loop
sleep:
  %eva = call i16 @events(ptr %ab, ptr %ba)
  %evb = call i16 @events(ptr %ba, ptr %ab)
  call void @set_pollfd(ptr %fds, i32 0, i32 %a, i16 %eva)
  call void @set_pollfd(ptr %fds, i32 1, i32 %b, i16 %evb)
  call void @set_pollfd(ptr %fds, i32 2, i32 %stop, i16 {select.POLLIN})
  %pr = call i32 @poll(ptr %fds, i64 3, i32 -1)
  %perr = icmp slt i32 %pr, 0
  br i1 %perr, label %pollerr, label %polled
pollerr:
  %pe = call i32 @errno_now()
  %pintr = icmp eq i32 %pe, {errno.EINTR}
  br i1 %pintr, label %woke, label %pollfail
pollfail:
  %pneg = sub i32 0, %pe
  %pneg64 = sext i32 %pneg to i64
  br label %finish
polled:
  %stoprev = getelementptr [3 x %PollFd], ptr %fds, i32 0, i32 2, i32 2
  %stopped = load i16, ptr %stoprev
  %isstop = icmp ne i16 %stopped, 0
  br i1 %isstop, label %stopping, label %woke
stopping:
  br label %finish
woke:
  br label %loop

finish:
  %rc = phi i64 [ %err64, %failed ], [ 0, %ended ], [ %pneg64, %pollfail ], [ {STOPPED}, %stopping ]
  %ma = getelementptr %Dir, ptr %ab, i32 0, i32 7
  %mb = getelementptr %Dir, ptr %ba, i32 0, i32 7
  %va = load i64, ptr %ma
  %vb = load i64, ptr %mb
  %o0 = getelementptr i64, ptr %moved, i32 0
  %o1 = getelementptr i64, ptr %moved, i32 1
  store i64 %va, ptr %o0
  store i64 %vb, ptr %o1
  ret i64 %rc
}}

define internal void @init_dir(ptr %d, i32 %src, i32 %dst, ptr %buf, i64 %pending, i64 %cap) {{
  %srcp = getelementptr %Dir, ptr %d, i32 0, i32 0
  %dstp = getelementptr %Dir, ptr %d, i32 0, i32 1
  %bufp = getelementptr %Dir, ptr %d, i32 0, i32 2
  %endp = getelementptr %Dir, ptr %d, i32 0, i32 4
  %capp = getelementptr %Dir, ptr %d, i32 0, i32 5
  store i32 %src, ptr %srcp
  store i32 %dst, ptr %dstp
  store ptr %buf, ptr %bufp
  store i64 %pending, ptr %endp
  store i64 %cap, ptr %capp
  ret void
}}
"""


class NativeRelayUnavailable(RuntimeError):
    """The native relay cannot run on this platform (the proxy falls back to a Python relay)."""


@functools.lru_cache(maxsize=1)
def relay_function():
    """JIT-compile the relay loop for this process; returns the ``ctypes`` function.

    Raises:
        NativeRelayUnavailable: not Linux on a 64-bit CPU, or LLVM failed.
    """
    if not sys.platform.startswith("linux") or struct.calcsize("P") != 8:
        raise NativeRelayUnavailable("the native relay needs 64-bit Linux")
    try:
        from ..compiler.codegen.llvm_init import ensure_llvm
        from ..compiler.codegen.runtime_ir import pause_ir
        from ..compiler.target import Target

        llvm = ensure_llvm()
        host = Target.host()
        module = llvm.parse_assembly(_relay_ir(*pause_ir(host.arch)))
        module.verify()
        machine = llvm.Target.from_triple(host.triple).create_target_machine(
            cpu=host.cpu, features=host.features, opt=2)
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        address = engine.get_function_address("kernelrpc_relay")
    except Exception as exc:  # ImportError, RuntimeError from LLVM
        raise NativeRelayUnavailable(f"cannot compile the native relay: {exc}") from exc
    if not address:
        raise NativeRelayUnavailable("LLVM did not produce kernelrpc_relay")
    function = _SIGNATURE(address)
    function.engine = engine  # the code lives as long as the engine
    return function


class NativeRelay:
    """One paired session relayed by :func:`relay_function` in a thread of its own.

    :meth:`close` only asks the loop to stop; the sockets are closed on the event
    loop once the thread has returned, so no descriptor is closed (and reused)
    while native code may still use it.
    """

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
        rc = self._function(a.fileno(), b.fileno(), ctypes.addressof(self._buffers[0]),
                            ctypes.addressof(self._buffers[1]),
                            BUFFER_BYTES, self._queued[0], self._queued[1], self._stop_r,
                            ctypes.addressof(self._stop_flag), self._spin_ns, moved)
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
