"""An in-kernel relay: a BPF sockhash whose verdict program sends each skb out of the partner.

Why: a user-space relay costs two extra process wake-ups per round trip (the proxy
must wake to read each message, then the receiver wakes), which on loopback is more
than the round trip itself.  With a socket in a BPF ``SOCKHASH`` and an ``sk_skb``
verdict program attached to the map, the kernel runs the program on every skb the
socket receives; ``bpf_sk_redirect_hash`` queues it for transmission on another
socket in the map, and the proxy process never runs.

One map and one program serve the whole proxy.  A pair (a, b) is two entries:
key ``cookie(a)`` -> socket b and key ``cookie(b)`` -> socket a, where the cookie is
the kernel's unique 64-bit socket id (``SO_COOKIE``).  The program, assembled below
from a handful of raw instructions, is::

    key = bpf_get_socket_cookie(skb)          # the socket the skb arrived on
    return bpf_sk_redirect_hash(skb, map, &key, 0)   # 0: egress of the partner

Closing a socket takes it out of the map (the kernel does that).  Redirected data
raises no ``EPOLLIN`` on the proxy's sockets; a peer's FIN does (``EPOLLRDHUP``, and
``recv`` returns EOF), so the proxy watches for hang-up to close the partner.

Everything is stdlib ``ctypes`` on the raw ``bpf(2)`` system call.  It needs Linux
with CAP_BPF/CAP_NET_ADMIN and ``BPF_SK_SKB_VERDICT`` (kernel >= 5.13);
:class:`Sockmap` raises :class:`SockmapUnavailable` (with the kernel's reason
and the verifier log) when any step is refused.

Measured limit (why this is bench-only, see docs/proxy.md): the kernel queues each
redirected skb on the partner's psock backlog without bound, so a peer that sends
faster than the other reads grows kernel memory until the OOM killer runs.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct
import sys

# bpf(2) commands (include/uapi/linux/bpf.h, enum bpf_cmd)
BPF_MAP_CREATE = 0
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8

BPF_MAP_TYPE_SOCKHASH = 18
BPF_PROG_TYPE_SK_SKB = 14
BPF_SK_SKB_VERDICT = 38
BPF_ANY = 0

# helper function ids (enum bpf_func_id)
BPF_FUNC_GET_SOCKET_COOKIE = 46
BPF_FUNC_SK_REDIRECT_HASH = 72

# instruction encoding (include/uapi/linux/bpf_common.h, bpf.h)
BPF_LD, BPF_STX, BPF_ALU64, BPF_JMP = 0x00, 0x03, 0x07, 0x05
BPF_IMM, BPF_MEM, BPF_DW = 0x00, 0x60, 0x18
BPF_K, BPF_X = 0x00, 0x08
BPF_ADD, BPF_MOV = 0x00, 0xB0
BPF_CALL, BPF_EXIT = 0x80, 0x90
BPF_PSEUDO_MAP_FD = 1
R0, R1, R2, R3, R4, R6, R10 = 0, 1, 2, 3, 4, 6, 10

SO_COOKIE = getattr(socket, "SO_COOKIE", 57)
_COOKIE = struct.Struct("=Q")
_FD = struct.Struct("=I")
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "riscv64": 280}
_ATTR_BYTES = 128  # larger than every attr used here; the kernel wants the tail zeroed
_LOG_BYTES = 64 * 1024
_LOG_LEVEL_VERIFIER = 1  # the verifier explains a rejection


class SockmapUnavailable(OSError):
    """The kernel refused a step of setting up the in-kernel relay."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("=BBhi", code, (src << 4) | dst, off, imm)


def verdict_program(map_fd: int) -> bytes:
    """The sk_skb verdict program: redirect each skb to the partner of the socket it came on."""
    return b"".join([
        _insn(BPF_ALU64 | BPF_MOV | BPF_X, R6, R1),                # r6 = skb
        _insn(BPF_JMP | BPF_CALL, imm=BPF_FUNC_GET_SOCKET_COOKIE),  # r0 = cookie(skb->sk)
        _insn(BPF_STX | BPF_MEM | BPF_DW, R10, R0, off=-8),        # key on the stack
        _insn(BPF_ALU64 | BPF_MOV | BPF_X, R1, R6),
        _insn(BPF_LD | BPF_IMM | BPF_DW, R2, BPF_PSEUDO_MAP_FD, imm=map_fd),
        _insn(0),                                                   # upper half of the imm64
        _insn(BPF_ALU64 | BPF_MOV | BPF_X, R3, R10),
        _insn(BPF_ALU64 | BPF_ADD | BPF_K, R3, imm=-8),             # r3 = &key
        _insn(BPF_ALU64 | BPF_MOV | BPF_K, R4, imm=0),              # flags 0: partner's egress
        _insn(BPF_JMP | BPF_CALL, imm=BPF_FUNC_SK_REDIRECT_HASH),   # r0 = SK_PASS / SK_DROP
        _insn(BPF_JMP | BPF_EXIT),
    ])


class _Bpf:
    def __init__(self) -> None:
        if sys.platform != "linux":
            raise SockmapUnavailable(errno.ENOSYS, "BPF sockmap needs Linux")
        number = _BPF_SYSCALL.get(platform.machine())
        if number is None:
            raise SockmapUnavailable(errno.ENOSYS, f"bpf(2) number unknown on {platform.machine()}")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._number = number

    def __call__(self, cmd: int, attr: bytes, what: str, log=None) -> int:
        buf = ctypes.create_string_buffer(attr.ljust(_ATTR_BYTES, b"\0"), _ATTR_BYTES)
        ret = self._libc.syscall(ctypes.c_long(self._number), ctypes.c_int(cmd), buf,
                                 ctypes.c_uint(_ATTR_BYTES))
        if ret < 0:
            err = ctypes.get_errno()
            detail = f"{what}: {os.strerror(err)}"
            if log is not None and log.value:
                detail += "; verifier log:\n" + log.value.decode(errors="replace")
            raise SockmapUnavailable(err, detail)
        return ret


def _addr(buf) -> int:
    return ctypes.addressof(buf)


class Sockmap:
    """One map and its verdict program; :meth:`add_pair` joins two sockets in the kernel."""

    def __init__(self, max_entries: int) -> None:
        self._bpf = _Bpf()
        self.map_fd = self._bpf(BPF_MAP_CREATE, struct.pack(
            "=IIIII", BPF_MAP_TYPE_SOCKHASH, _COOKIE.size, _FD.size, max_entries, 0),
            "creating a SOCKHASH map")
        self.prog_fd = -1
        try:
            self.prog_fd = self._load(verdict_program(self.map_fd))
            self._bpf(BPF_PROG_ATTACH, struct.pack(
                "=IIII", self.map_fd, self.prog_fd, BPF_SK_SKB_VERDICT, 0),
                "attaching the verdict program to the map")
        except BaseException:
            self.close()
            raise

    def _load(self, code: bytes) -> int:
        insns = ctypes.create_string_buffer(code, len(code))
        license_ = ctypes.create_string_buffer(b"GPL")
        log = ctypes.create_string_buffer(_LOG_BYTES)
        name = b"kernelrpc_relay"[:15].ljust(16, b"\0")
        attr = struct.pack("=IIQQIIQII16s", BPF_PROG_TYPE_SK_SKB, len(code) // 8, _addr(insns),
                           _addr(license_), _LOG_LEVEL_VERIFIER, _LOG_BYTES, _addr(log), 0, 0, name)
        return self._bpf(BPF_PROG_LOAD, attr, "loading the sk_skb verdict program", log)

    def _update(self, key: int, fd: int) -> None:
        k = ctypes.create_string_buffer(_COOKIE.pack(key), _COOKIE.size)
        v = ctypes.create_string_buffer(_FD.pack(fd), _FD.size)
        self._bpf(BPF_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", self.map_fd, 0, _addr(k), _addr(v),
                                                   BPF_ANY), "adding a socket to the sockhash")

    def _delete(self, key: int) -> None:
        k = ctypes.create_string_buffer(_COOKIE.pack(key), _COOKIE.size)
        try:
            self._bpf(BPF_MAP_DELETE_ELEM, struct.pack("=IIQ", self.map_fd, 0, _addr(k)),
                      "removing a socket from the sockhash")
        except SockmapUnavailable as exc:
            if exc.errno != errno.ENOENT:
                raise

    def add_pair(self, a: socket.socket, b: socket.socket) -> None:
        """From now on the kernel moves every byte a receives to b, and vice versa."""
        ka, kb = cookie(a), cookie(b)
        self._update(ka, b.fileno())
        try:
            self._update(kb, a.fileno())
        except SockmapUnavailable:
            self._delete(ka)
            raise

    def close(self) -> None:
        for fd in (self.prog_fd, self.map_fd):
            if fd >= 0:
                os.close(fd)
        self.prog_fd = self.map_fd = -1


def cookie(sock: socket.socket) -> int:
    return _COOKIE.unpack(sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, _COOKIE.size))[0]
