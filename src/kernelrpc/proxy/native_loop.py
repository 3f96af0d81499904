"""The native relay loop, built with ``llvmlite.ir`` from named layouts.

Python equivalent, per paired session (``a``, ``b`` non-blocking sockets)::

    while not stop_flag:
        p = pump(a -> b) | pump(b -> a)         # < 0: a socket failed (-errno)
        if a direction ended (EOF, all it sent delivered): return 0
        if p & READ_SHORT: last_short = now()   # a request or a reply went through
        elif not p and now() - last_short >= spin_ns:
            poll([a, b, stop_fd])               # sleep until there is work
        (else: spin_hint() and go round again)
    return STOPPED

``pump`` reads into the direction's buffer when it is empty (``recv``), then sends
what it holds (``send``) until the destination would block.  The function's
parameters are :data:`PARAMS`, the one place the ABI is declared: the IR
signature and the ``ctypes`` prototype are both generated from it.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import select
import socket
import time
from dataclasses import dataclass

from llvmlite import ir

from ..native.jit import JitFunction, jit_function, spin_hint
from ..native.llvm import host_cpu

I16, I32, I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
I8 = ir.IntType(8)
PTR = ir.PointerType()

NAME = "kernelrpc_relay"
#: Reads shorter than this look like requests and replies and (re)start the polling
#: window; bulk transfers do not, so they do not take a core from the peers.
SHORT_READ_BYTES = 16 << 10
STOPPED = 1  # return value: stopped through stop_flag / stop_fd
MOVED = 1    # pump result bits: moved bytes or saw EOF
READ_SHORT = 2  # ... read a short message

_DONTWAIT = socket.MSG_DONTWAIT
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)
_RETRY = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR)


@dataclass(frozen=True)
class Param:
    name: str
    ir_type: ir.Type
    c_type: type
    meaning: str


PARAMS = (
    Param("a", I32, ctypes.c_int32, "socket a"),
    Param("b", I32, ctypes.c_int32, "socket b"),
    Param("buf_ab", PTR, ctypes.c_void_p, "buffer from a to b (cap bytes)"),
    Param("buf_ba", PTR, ctypes.c_void_p, "buffer from b to a (cap bytes)"),
    Param("cap", I64, ctypes.c_int64, "size of each buffer"),
    Param("pend_ab", I64, ctypes.c_int64, "bytes already in buf_ab for b (the pairing reply)"),
    Param("pend_ba", I64, ctypes.c_int64, "bytes already in buf_ba for a"),
    Param("stop_fd", I32, ctypes.c_int32, "readable when the loop must stop (ends a poll)"),
    Param("stop_flag", PTR, ctypes.c_void_p, "int32, non-zero when the loop must stop"),
    Param("spin_ns", I64, ctypes.c_int64, "keep polling this long after a short message"),
    Param("moved", PTR, ctypes.c_void_p, "int64[2]: bytes read from a, from b (written at exit)"),
)
RESULT = (I64, ctypes.c_int64)  # 0: a side ended; STOPPED; -errno: a socket failed
PROTOTYPE = ctypes.CFUNCTYPE(RESULT[1], *(p.c_type for p in PARAMS))


def arguments(**values) -> list:
    """The values in :data:`PARAMS` order; every parameter exactly once, by name."""
    names = [p.name for p in PARAMS]
    if set(values) != set(names):
        raise TypeError(f"{NAME} takes {names}, got {sorted(values)}")
    return [values[name] for name in names]


class Layout:
    """A struct type whose fields are reached by name."""

    def __init__(self, *fields: tuple[str, ir.Type]) -> None:
        self.index = {name: i for i, (name, _) in enumerate(fields)}
        self.types = dict(fields)
        self.type = ir.LiteralStructType([t for _, t in fields])

    def field(self, b: ir.IRBuilder, base, name: str):
        return b.gep(base, [I32(0), I32(self.index[name])], inbounds=True, source_etype=self.type)

    def load(self, b: ir.IRBuilder, base, name: str):
        return b.load(self.field(b, base, name), typ=self.types[name])

    def store(self, b: ir.IRBuilder, base, name: str, value) -> None:
        if not isinstance(value, ir.Value):
            value = self.types[name](value)
        b.store(value, self.field(b, base, name))


#: One direction: bytes [start, end) of buf are still to be sent to dst.
DIRECTION = Layout(("src", I32), ("dst", I32), ("buf", PTR), ("start", I64), ("end", I64),
                   ("cap", I64), ("eof", I32), ("moved", I64))
POLLFD = Layout(("fd", I32), ("events", I16), ("revents", I16))  # <poll.h>, Linux
TIMESPEC = Layout(("tv_sec", I64), ("tv_nsec", I64))              # <time.h>, 64-bit Linux


def _stack(b: ir.IRBuilder, type_: ir.Type):
    """A stack slot as an opaque pointer (llvmlite's ``alloca`` yields a typed one)."""
    slot = b.alloca(type_)
    slot.type = PTR
    return slot


class _Module:
    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.module = ir.Module(name=NAME)
        declare = self._declare
        self.recv = declare("recv", I64, I32, PTR, I64, I32)
        self.send = declare("send", I64, I32, PTR, I64, I32)
        self.poll = declare("poll", I32, PTR, I64, I32)
        self.errno_location = declare("__errno_location", PTR)
        self.clock_gettime = declare("clock_gettime", I32, I32, PTR)
        self.now_ns = self._now_ns()
        self.pump = self._pump()
        self._relay()

    def _declare(self, name, result, *params):
        return ir.Function(self.module, ir.FunctionType(result, params), name)

    def _internal(self, name, result, *params):
        function = self._declare(name, result, *params)
        function.linkage = "internal"
        return function, ir.IRBuilder(function.append_basic_block("entry"))

    def _errno(self, b):
        return b.load(b.call(self.errno_location, []), typ=I32)

    def _return_unless_retry(self, b, value) -> None:
        """errno says try again later: return ``value``; else return -errno."""
        err = self._errno(b)
        retry = functools.reduce(b.or_, [b.icmp_signed("==", err, I32(e)) for e in _RETRY])
        with b.if_then(b.not_(retry)):
            b.ret(b.neg(err))
        b.ret(value)

    def _now_ns(self):
        function, b = self._internal("now_ns", I64)
        ts = _stack(b, TIMESPEC.type)
        b.call(self.clock_gettime, [I32(time.CLOCK_MONOTONIC), ts])
        seconds = TIMESPEC.load(b, ts, "tv_sec")
        b.ret(b.add(b.mul(seconds, I64(1_000_000_000)), TIMESPEC.load(b, ts, "tv_nsec")))
        return function

    def _pump(self):
        """``pump(dir)``: MOVED|READ_SHORT bits, or -errno."""
        function, b = self._internal("pump", I32, PTR)
        d = function.args[0]
        get = lambda name: DIRECTION.load(b, d, name)  # noqa: E731
        progress = _stack(b, I32)
        b.store(I32(0), progress)
        empty = b.icmp_signed("==", get("start"), get("end"))
        with b.if_then(b.and_(empty, b.icmp_signed("==", get("eof"), I32(0)))):
            n = b.call(self.recv, [get("src"), get("buf"), get("cap"), I32(_DONTWAIT)])
            with b.if_then(b.icmp_signed("==", n, I64(0))):
                DIRECTION.store(b, d, "eof", 1)
                b.ret(I32(MOVED))
            with b.if_then(b.icmp_signed("<", n, I64(0))):
                self._return_unless_retry(b, I32(0))
            DIRECTION.store(b, d, "start", 0)
            DIRECTION.store(b, d, "end", n)
            DIRECTION.store(b, d, "moved", b.add(get("moved"), n))
            short = b.icmp_signed("<", n, I64(SHORT_READ_BYTES))
            b.store(b.select(short, I32(MOVED | READ_SHORT), I32(MOVED)), progress)
        sending = function.append_basic_block("sending")
        b.branch(sending)
        b.position_at_end(sending)
        start, end = get("start"), get("end")
        with b.if_then(b.icmp_signed("==", start, end)):  # all delivered
            DIRECTION.store(b, d, "start", 0)
            DIRECTION.store(b, d, "end", 0)
            b.ret(b.load(progress, typ=I32))
        data = b.gep(get("buf"), [start], source_etype=I8)
        w = b.call(self.send, [get("dst"), data, b.sub(end, start), I32(_DONTWAIT | _NOSIGNAL)])
        with b.if_then(b.icmp_signed("<=", w, I64(0))):
            self._return_unless_retry(b, b.load(progress, typ=I32))
        DIRECTION.store(b, d, "start", b.add(start, w))
        b.store(b.or_(b.load(progress, typ=I32), I32(MOVED)), progress)
        b.branch(sending)
        return function

    def _relay(self) -> None:
        function = self._declare(NAME, RESULT[0], *(p.ir_type for p in PARAMS))
        arg = {p.name: value for p, value in zip(PARAMS, function.args)}
        for value, p in zip(function.args, PARAMS):
            value.name = p.name
        b = ir.IRBuilder(function.append_basic_block("entry"))
        ab, ba = _stack(b, DIRECTION.type), _stack(b, DIRECTION.type)
        for d, src, dst, buf, pending in ((ab, "a", "b", "buf_ab", "pend_ab"),
                                          (ba, "b", "a", "buf_ba", "pend_ba")):
            for name, value in (("src", arg[src]), ("dst", arg[dst]), ("buf", arg[buf]),
                                ("start", 0), ("end", arg[pending]), ("cap", arg["cap"]),
                                ("eof", 0), ("moved", 0)):
                DIRECTION.store(b, d, name, value)
        fds_type = ir.ArrayType(POLLFD.type, 3)
        fds = _stack(b, fds_type)
        last_short = _stack(b, I64)
        b.store(b.call(self.now_ns, []), last_short)

        def finish(rc) -> None:
            for i, d in enumerate((ab, ba)):
                b.store(DIRECTION.load(b, d, "moved"),
                        b.gep(arg["moved"], [I64(i)], source_etype=I64))
            b.ret(rc)

        def ended(d):
            delivered = b.icmp_signed("==", DIRECTION.load(b, d, "start"),
                                      DIRECTION.load(b, d, "end"))
            return b.and_(b.icmp_signed("!=", DIRECTION.load(b, d, "eof"), I32(0)), delivered)

        def poll_events(source, towards):
            """POLLIN if ``source`` may read (open, buffer empty), POLLOUT if ``towards`` holds bytes."""
            readable = b.and_(b.icmp_signed("==", DIRECTION.load(b, source, "eof"), I32(0)),
                              b.icmp_signed("==", DIRECTION.load(b, source, "start"),
                                            DIRECTION.load(b, source, "end")))
            pending = b.icmp_signed("!=", DIRECTION.load(b, towards, "start"),
                                    DIRECTION.load(b, towards, "end"))
            return b.or_(b.select(readable, I16(select.POLLIN), I16(0)),
                         b.select(pending, I16(select.POLLOUT), I16(0)))

        def pollfd(i):
            return b.gep(fds, [I32(0), I32(i)], inbounds=True, source_etype=fds_type)

        loop = function.append_basic_block("loop")
        b.branch(loop)
        b.position_at_end(loop)
        halt = b.load_atomic(arg["stop_flag"], "monotonic", 4, typ=I32)
        with b.if_then(b.icmp_signed("!=", halt, I32(0))):
            finish(I64(STOPPED))
        p1 = b.call(self.pump, [ab])
        p2 = b.call(self.pump, [ba])
        for p in (p1, p2):
            with b.if_then(b.icmp_signed("<", p, I32(0))):
                finish(b.sext(p, I64))
        with b.if_then(b.or_(ended(ab), ended(ba))):
            finish(I64(0))
        progress = b.or_(p1, p2)
        with b.if_then(b.icmp_signed("!=", b.and_(progress, I32(READ_SHORT)), I32(0))):
            b.store(b.call(self.now_ns, []), last_short)
            b.branch(loop)
        with b.if_then(b.icmp_signed("!=", progress, I32(0))):
            b.branch(loop)
        quiet_ns = b.sub(b.call(self.now_ns, []), b.load(last_short, typ=I64))
        with b.if_then(b.icmp_signed("<", quiet_ns, arg["spin_ns"])):
            spin_hint(b, self.arch)
            b.branch(loop)
        for i, fd, events in ((0, arg["a"], poll_events(ab, ba)), (1, arg["b"], poll_events(ba, ab)),
                              (2, arg["stop_fd"], I16(select.POLLIN))):
            POLLFD.store(b, pollfd(i), "fd", fd)
            POLLFD.store(b, pollfd(i), "events", events)
            POLLFD.store(b, pollfd(i), "revents", 0)
        ready = b.call(self.poll, [fds, I64(3), I32(-1)])
        with b.if_then(b.icmp_signed("<", ready, I32(0))):
            err = self._errno(b)
            with b.if_then(b.icmp_signed("!=", err, I32(errno.EINTR))):
                finish(b.sext(b.neg(err), I64))
            b.branch(loop)
        with b.if_then(b.icmp_signed("!=", POLLFD.load(b, pollfd(2), "revents"), I16(0))):
            finish(I64(STOPPED))
        b.branch(loop)


def relay_module(arch: str) -> ir.Module:
    """The IR module defining :data:`NAME` for a CPU of architecture ``arch``."""
    return _Module(arch).module


@dataclass(frozen=True)
class RelayLoop:
    """The compiled loop, called with :data:`PARAMS` by name; returns :data:`RESULT`."""

    jit: JitFunction

    def __call__(self, **values) -> int:
        return self.jit(*arguments(**values))


def compile_relay() -> RelayLoop:
    """JIT-compile the loop for this host (LLVM's errors propagate)."""
    return RelayLoop(jit_function(relay_module(host_cpu().arch), NAME, PROTOTYPE))
