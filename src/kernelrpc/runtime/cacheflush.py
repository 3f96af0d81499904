"""Evicting tensors from the CPU caches between repeats (``cache_flush_cpu_non_first_arg``)."""
from __future__ import annotations

import ctypes
import glob
import re

from .buffer import AlignedBuffer

DEFAULT_LLC_BYTES = 32 << 20
MAX_SCRATCH_BYTES = 512 << 20


def last_level_cache_bytes() -> int:
    """The largest cache size Linux reports in sysfs, or a conservative default."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", text)
        if match:
            sizes.append(int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)])
    return max(sizes, default=DEFAULT_LLC_BYTES)


class ScratchFlusher:
    """Flushes by writing a buffer twice the size of the last-level cache: the fallback for
    modules without ``__kernelrpc_cache_flush``. The buffer is allocated on first use."""

    def __init__(self):
        self._scratch: AlignedBuffer | None = None
        self._fill = 0

    def flush(self) -> None:
        if self._scratch is None:
            self._scratch = AlignedBuffer(min(2 * last_level_cache_bytes(), MAX_SCRATCH_BYTES))
        self._fill = (self._fill + 1) & 0xFF
        ctypes.memset(self._scratch.address, self._fill, self._scratch.nbytes)
