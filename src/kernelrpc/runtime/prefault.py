"""Map in the pages of a buffer before a socket writes into it.

A large tensor copied from a device lands in memory just allocated (``numpy()`` makes a new
array each time), whose pages the kernel maps on first write. Faulting them in one by one
inside ``recv_into`` made 64 MiB downloads swing between 250 and 2,300 MB/s from call to call
(docs/performance.md, "Downloads of large tensors"): the first write of each page traps while
the receive path holds the socket, and on a fresh mapping the first faults also wait for huge
pages. ``MADV_POPULATE_WRITE`` (Linux 5.14) maps the whole range in one system call, without
writing a byte, so the copy afterwards runs at the speed of warm memory.

Standard library only: the device server prefaults the tensors clients upload into too.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import sys

#: Buffers from this size on are prefaulted (below it, faults cost less than the call).
PREFAULT_BYTES = 1 << 20
MADV_POPULATE_WRITE = 23        # linux/mman.h; not in Python's mmap module before 3.13

_PAGE = mmap.PAGESIZE
_libc = None
_populate_works = sys.platform.startswith("linux")


def _functions():
    """libc's ``madvise`` and ``mincore``, typed (loaded on first use)."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        libc.mincore.restype = ctypes.c_int
        _libc = libc
    return _libc


def _libc_madvise():
    return _functions().madvise


def _all_resident(start: int, length: int) -> bool:
    """Whether every page of ``[start, start + length)`` is mapped in (``mincore``: ~25 µs for
    64 MiB, where populating pages already there walks them at ~3 ms)."""
    pages = ctypes.create_string_buffer(-(-length // _PAGE))
    if _functions().mincore(start, length, pages) != 0:
        return False
    return pages.raw.count(0) == 0


def prefault(view: memoryview) -> str:
    """Map in the pages under the writable byte view ``view``; returns how ("populate",
    "touch", "resident" when every page already was, or "small" for a view below
    :data:`PREFAULT_BYTES`, left as it is).

    Where the kernel has no ``MADV_POPULATE_WRITE`` (older than 5.14, not Linux), one byte per
    page is written instead; the caller overwrites the whole view next, so the zeros written
    there are never seen.
    """
    global _populate_works
    nbytes = view.nbytes
    if nbytes < PREFAULT_BYTES:
        return "small"
    if _populate_works:
        address = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(view))
        start = address - address % _PAGE
        end = address + nbytes
        if _all_resident(start, end - start):
            return "resident"               # a buffer written before (a copyto target, reused)
        if _libc_madvise()(start, end - start, MADV_POPULATE_WRITE) == 0:
            return "populate"
        if ctypes.get_errno() not in (errno.EINVAL, errno.ENOSYS):
            # EFAULT/ENOMEM (a range the kernel cannot populate): touch it page by page below
            return _touch(view)
        _populate_works = False          # a kernel without the advice: never ask again
    return _touch(view)


def _touch(view: memoryview) -> str:
    pages = view[::_PAGE]
    pages[:] = bytes(len(pages))
    return "touch"
