"""The oldest glibc a linked module loads on: the newest ``GLIBC_x.y`` symbol version it needs.

A module linked by the host ``cc`` or a user's cross gcc takes its symbol versions from that
toolchain's C library: built on a glibc 2.36 host, ``pthread_create`` comes as
``GLIBC_2.34``, and a board with glibc 2.31 refuses the file at ``dlopen``. The linker
writes what the file needs into its version-needs section (``.gnu.version_r``); this reads
it (standard library only, every offset checked against the file), so the module's record
says ``glibc>=2.34`` and the device refuses it before ``dlopen`` with a message that says so.
"""
from __future__ import annotations

import re
import struct

_SHT_GNU_VERNEED = 0x6FFFFFFE
_GLIBC_VERSION = re.compile(rb"^GLIBC_(\d+(?:\.\d+)+)$")
_MAX_ENTRIES = 4096


def glibc_floor(path) -> str | None:
    """``"2.34"`` for a shared library that needs ``GLIBC_2.34`` (and nothing newer), or None
    when it needs no versioned glibc symbol or is not a readable ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        names = list(_needed_versions(data))
    except struct.error:
        return None
    versions = [tuple(int(p) for p in m.group(1).split(b"."))
                for m in map(_GLIBC_VERSION.match, names) if m]
    return ".".join(map(str, max(versions))) if versions else None


def _needed_versions(data: bytes):
    if data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    header = order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
    fields = struct.unpack_from(header, data, 16)
    shoff, shentsize, shnum = fields[5], fields[10], fields[11]
    section = order + ("IIQQQQIIQQ" if wide else "IIIIIIIIII")
    sections = [struct.unpack_from(section, data, shoff + k * shentsize)
                for k in range(min(shnum, _MAX_ENTRIES))]
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != _SHT_GNU_VERNEED or link >= len(sections):
            continue
        strings_at, strings_size = sections[link][4], sections[link][5]
        strings = data[strings_at:strings_at + strings_size]
        need, end = offset, offset + size
        for _ in range(_MAX_ENTRIES):
            _version, count, _file, aux, following = struct.unpack_from(order + "HHIII", data,
                                                                         need)
            entry = need + aux
            for _ in range(min(count, _MAX_ENTRIES)):
                _hash, _flags2, _other, name, step = struct.unpack_from(order + "IHHII", data,
                                                                        entry)
                stop = strings.find(b"\0", name)
                if 0 <= name < len(strings) and stop >= 0:
                    yield strings[name:stop]
                if not step:
                    break
                entry += step
            if not following or need + following >= end:
                break
            need += following
