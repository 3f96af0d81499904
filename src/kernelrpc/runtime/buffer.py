"""64-byte-aligned host memory with a stable address, for tensors and kernel arguments.

The memory is owned by Python (no malloc/free pairing to get wrong): a bytearray for small
buffers, a private anonymous mmap (page-aligned, zero pages mapped lazily, no memset) for large
ones. ``free()`` drops the buffer's own references; memory is returned once no memoryview handed
out earlier is alive, so a stale view can never read freed memory.
"""
from __future__ import annotations

import ctypes
import mmap

ALIGNMENT = 64
# From this size on (numpy's choice too) a private mapping with transparent huge pages: a fresh
# 64 MiB buffer then fills at ~6 GiB/s here instead of ~1.5 GiB/s with 4 KiB page faults.
MMAP_THRESHOLD = 4 << 20


class BufferView:
    """What every buffer kind offers: its address, its byte view, and whether it was freed.
    Subclasses set ``_view`` (None once freed) and ``_address``."""

    __slots__ = ()

    @property
    def freed(self) -> bool:
        return self._view is None

    @property
    def address(self) -> int:
        self._check()
        return self._address

    @property
    def view(self) -> memoryview:
        """A writable, byte-format memoryview of exactly ``nbytes`` bytes (no copy)."""
        self._check()
        return self._view

    def _check(self) -> None:
        if self._view is None:
            raise ValueError("the buffer has been freed")


class AlignedBuffer(BufferView):
    __slots__ = ("nbytes", "_raw", "_pin", "_view", "_address")

    def __init__(self, nbytes: int, alignment: int = ALIGNMENT):
        if nbytes < 0:
            raise ValueError(f"buffer size must be non-negative, got {nbytes}")
        self.nbytes = nbytes
        if nbytes >= MMAP_THRESHOLD and mmap.PAGESIZE % alignment == 0:
            self._raw = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._raw.madvise(mmap.MADV_HUGEPAGE)
        else:
            self._raw = bytearray(nbytes + alignment)
        # Exporting a ctypes view pins the memory: it cannot be resized (and moved) from now on.
        self._pin = (ctypes.c_char * len(self._raw)).from_buffer(self._raw)
        base = ctypes.addressof(self._pin)
        offset = -base % alignment
        self._address = base + offset
        self._view = memoryview(self._raw)[offset:offset + nbytes]

    def free(self) -> None:
        self._view = self._pin = self._raw = None
        self._address = 0
