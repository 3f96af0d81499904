"""runtime.prefault: the pages of a download's target are mapped before the socket writes them,
without changing a byte the caller can see (the populate advice) and on any kernel (touch)."""
import mmap
import os
import platform

import numpy as np
import pytest

from kernelrpc import nd, rpc
from kernelrpc.runtime import prefault


def _linux_at_least(major: int, minor: int) -> bool:
    if not platform.system() == "Linux":
        return False
    found = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    return found >= (major, minor)


def _resident_pages(buf: mmap.mmap) -> int:
    """Pages of the mapping ``buf`` that are mapped in, from /proc/self/pagemap (bit 63 of a
    page's entry: present). /proc/self/smaps would do only while the kernel keeps ``buf`` an
    area of its own: next to another anonymous mapping it merges them."""
    import ctypes
    import struct
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    pages = len(buf) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(address // mmap.PAGESIZE * 8)
        entries = struct.unpack(f"{pages}Q", f.read(8 * pages))
    return sum(1 for entry in entries if entry >> 63)


@pytest.mark.skipif(not _linux_at_least(5, 14), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_populate_maps_every_page_of_a_fresh_mapping_and_keeps_its_bytes():
    nbytes = 8 << 20
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    buf[:4] = b"keep"
    buf[-4:] = b"tail"
    before = _resident_pages(buf)
    assert before < nbytes // mmap.PAGESIZE // 2
    assert prefault.prefault(memoryview(buf)) == "populate"
    assert _resident_pages(buf) == nbytes // mmap.PAGESIZE
    assert buf[:4] == b"keep" and buf[-4:] == b"tail" and buf[4:-4].count(0) == nbytes - 8
    assert prefault.prefault(memoryview(buf)) == "resident"     # nothing left to map in


def test_touch_maps_the_pages_and_small_views_are_left_alone(monkeypatch):
    monkeypatch.setattr(prefault, "_populate_works", False)
    nbytes = 4 << 20
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    assert prefault.prefault(memoryview(buf)) == "touch"
    if platform.system() == "Linux":
        assert _resident_pages(buf) == nbytes // mmap.PAGESIZE
    assert prefault.prefault(memoryview(bytearray(4096))) == "small"


def test_large_copies_both_ways_arrive_whole(server):
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    data = rng.integers(0, 255, (3 << 20) + 17, dtype=np.uint8)  # not a multiple of a page
    with rpc.connect(server.host, server.port, key="dev") as sess:
        remote = nd.array(data, sess.cpu(0))
        assert np.array_equal(remote.numpy(), data)
        target = np.empty_like(data)
        remote.copyto(target)
        assert np.array_equal(target, data)
