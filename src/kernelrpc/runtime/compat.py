"""Will this module run here? Checks made on the file before ``dlopen``.

The dynamic loader's own answer to a module for another machine is
"cannot open shared object file: No such file or directory" (glibc, for an
ELF of the wrong class or float ABI) or a bare "wrong ELF class"; this module
says instead what the module was built for and what this device is:

* the ELF header: class (32/64-bit), byte order, machine, and the float ABI in
  ``e_flags`` (Arm hard-float, RISC-V single/double), compared with the header
  of the running Python interpreter (the process that would ``dlopen`` it);
* the module's target record (the ``kernelrpc_metadata`` section, read from the
  file): CPU features it was built with that this CPU lacks, and the glibc
  floor it was linked against.

Standard library only (it runs on devices). The CPU features come from the
kernel: ``AT_HWCAP``/``AT_HWCAP2`` on Arm (correct under qemu-user too), else
``/proc/cpuinfo``; where neither describes this CPU, features are not checked.
"""
from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import platform
import struct
import sys
from dataclasses import dataclass

from ..errors import ModuleError

__all__ = ["ElfInfo", "IncompatibleModuleError", "LibcTooOldError", "MissingCPUFeaturesError",
           "WrongArchitectureError", "check_module_file", "cpu_features", "read_elf"]

log = logging.getLogger(__name__)

METADATA_SECTION = b"kernelrpc_metadata"
MAX_SECTIONS = 1 << 16
MAX_METADATA_BYTES = 64 << 20

_MACHINES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390x", 40: "arm",
             62: "x86_64", 183: "aarch64", 243: "riscv"}
_EF_ARM_ABI_FLOAT_HARD = 0x400
_EF_ARM_ABI_FLOAT_SOFT = 0x200
_EF_RISCV_FLOAT_ABI = 0x6
_RISCV_FLOAT_ABI = {0: "soft-float", 2: "single-float", 4: "double-float", 6: "quad-float"}


class IncompatibleModuleError(ModuleError):
    """The module is a kernelrpc module, but not for this device."""


class WrongArchitectureError(IncompatibleModuleError):
    """Built for another instruction set, word size, byte order or float ABI."""


class MissingCPUFeaturesError(IncompatibleModuleError):
    """Built with CPU features (``-mattr``) this device's CPU lacks."""


class LibcTooOldError(IncompatibleModuleError):
    """Linked against a newer glibc than this device has."""


@dataclass(frozen=True)
class ElfInfo:
    bits: int                   # 32 or 64
    little_endian: bool
    machine: int                # e_machine
    flags: int                  # e_flags
    elf_type: int               # e_type (3: shared object)
    sections: tuple = ()        # (name, offset, size) of each section, if read

    @property
    def arch(self) -> str:
        name = _MACHINES.get(self.machine, f"machine {self.machine}")
        return f"riscv{self.bits}" if name == "riscv" else name

    @property
    def float_abi(self) -> str:
        if self.machine == 40:
            if self.flags & _EF_ARM_ABI_FLOAT_HARD:
                return "hard-float"
            return "soft-float" if self.flags & _EF_ARM_ABI_FLOAT_SOFT else ""
        if self.machine == 243:
            return _RISCV_FLOAT_ABI[self.flags & _EF_RISCV_FLOAT_ABI]
        return ""

    def describe(self) -> str:
        parts = [self.arch, f"{self.bits}-bit", "little-endian" if self.little_endian
                 else "big-endian"]
        if self.float_abi:
            parts.append(self.float_abi)
        return " ".join(parts)


def read_elf(f, with_sections: bool = False) -> ElfInfo | None:
    """The header (and optionally the section table) of the ELF file open as ``f``;
    None when it is not ELF. Every offset and count is checked against the file."""
    f.seek(0)
    ident = f.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) \
            or ident[5] not in (1, 2):
        return None
    bits, order = (32 if ident[4] == 1 else 64), ("<" if ident[5] == 1 else ">")
    layout = order + ("HHIIIIIHHHHHH" if bits == 32 else "HHIQQQIHHHHHH")
    rest = f.read(struct.calcsize(layout))
    if len(rest) < struct.calcsize(layout):
        return None
    (e_type, machine, _version, _entry, _phoff, shoff, flags, _ehsize, _phentsize, _phnum,
     shentsize, shnum, shstrndx) = struct.unpack(layout, rest)
    info = ElfInfo(bits, order == "<", machine, flags, e_type)
    if not with_sections:
        return info
    return ElfInfo(bits, order == "<", machine, flags, e_type,
                   _sections(f, order, bits, shoff, shentsize, shnum, shstrndx))


def _sections(f, order, bits, shoff, shentsize, shnum, shstrndx) -> tuple:
    layout = order + ("IIIIIIIIII" if bits == 32 else "IIQQQQIIQQ")
    size = os.fstat(f.fileno()).st_size
    if not shoff or shnum > MAX_SECTIONS or shentsize < struct.calcsize(layout) \
            or shoff + shnum * shentsize > size or shstrndx >= shnum:
        return ()
    headers = []
    for index in range(shnum):
        f.seek(shoff + index * shentsize)
        fields = struct.unpack(layout, f.read(struct.calcsize(layout)))
        headers.append((fields[0], fields[4], fields[5]))     # name, offset, size
    _, str_offset, str_size = headers[shstrndx]
    if str_offset + str_size > size:
        return ()
    f.seek(str_offset)
    names = f.read(min(str_size, 1 << 20))
    out = []
    for name_at, offset, length in headers:
        end = names.find(b"\0", name_at)
        name = names[name_at:end] if 0 <= name_at < len(names) and end >= 0 else b""
        out.append((name, offset, length))
    return tuple(out)


def _section_bytes(f, info: ElfInfo, name: bytes) -> bytes | None:
    size = os.fstat(f.fileno()).st_size
    for section, offset, length in info.sections:
        if section == name and length <= MAX_METADATA_BYTES and offset + length <= size:
            f.seek(offset)
            return f.read(length)
    return None


@functools.lru_cache(maxsize=1)
def this_process() -> ElfInfo | None:
    """The ELF header of the running interpreter: what this process can ``dlopen``."""
    for path in (sys.executable, "/proc/self/exe"):
        try:
            with open(os.path.realpath(path), "rb") as f:
                info = read_elf(f)
        except OSError:
            continue
        if info is not None:
            return info
    return None


def glibc_version() -> str | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    return text.split()[1] if text.startswith("glibc ") else None


def check_module_file(path: str) -> dict | None:
    """Raise an :class:`IncompatibleModuleError` when ``path`` cannot run in this process;
    return the target record from the file's metadata section (None if it has none)."""
    with open(path, "rb") as f:
        info = read_elf(f, with_sections=True)
        if info is None:
            raise ModuleError(f"cannot load {path}: not an ELF shared library")
        raw = _section_bytes(f, info, METADATA_SECTION)
    record = _target_record(raw)
    built_for = record.get("triple") if record else None
    here = this_process()
    if here is not None:
        if (info.bits, info.little_endian, info.machine) != (here.bits, here.little_endian,
                                                             here.machine) \
                or (info.float_abi and here.float_abi and info.float_abi != here.float_abi):
            raise WrongArchitectureError(
                f"{os.path.basename(path)} was built for {built_for or info.arch} "
                f"({info.describe()}); this device is {platform.machine()} ({here.describe()})")
    if info.elf_type != 3:
        raise ModuleError(f"cannot load {path}: an ELF file but not a shared library (e_type "
                          f"{info.elf_type})")
    if record:
        _check_features(path, record)
        _check_libc(path, record)
    return record


def _target_record(raw: bytes | None) -> dict | None:
    if not raw:
        return None
    try:
        doc = json.loads(raw.split(b"\0", 1)[0])
    except (ValueError, RecursionError):
        return None         # parse_metadata reports a broken document after dlopen
    target = doc.get("target") if isinstance(doc, dict) else None
    return target if isinstance(target, dict) else None


def _check_features(path: str, record: dict) -> None:
    features = record.get("features")
    if not isinstance(features, str) or not features:
        return
    here = cpu_features()
    if here is None:
        log.debug("%s: this CPU's features are unknown here; not checking %s", path, features)
        return
    names = _FEATURE_NAMES.get(_process_family(), {})
    missing = []
    for item in features.split(","):
        if not item.startswith("+"):
            continue
        alternatives = names.get(item[1:])
        if alternatives is not None and not here.intersection(alternatives):
            missing.append(item)
    if missing:
        raise MissingCPUFeaturesError(
            f"{os.path.basename(path)} needs CPU features {','.join(missing)} that this device "
            f"lacks (built for {str(record.get('string', record.get('triple')))[:200]}); "
            "rebuild without them, e.g. for the target remote.target() reports")


def _check_libc(path: str, record: dict) -> None:
    libc = record.get("libc")
    if not isinstance(libc, str) or not libc.startswith("glibc>="):
        return
    have = glibc_version()
    if have is None:
        return
    if _version_tuple(have) < _version_tuple(libc[len("glibc>="):]):
        raise LibcTooOldError(f"{os.path.basename(path)} needs {libc}; this device has "
                              f"glibc {have}")


def _version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def _process_family() -> str:
    """The instruction set of this process (a 32-bit armhf Python on an AArch64 kernel is
    ``arm``, whatever ``uname -m`` says), as the feature tables name it."""
    here = this_process()
    if here is not None and here.arch in ("aarch64", "arm", "x86_64", "riscv64"):
        return here.arch
    return _family(platform.machine())


def _family(machine: str) -> str:
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    if machine.startswith("arm"):
        return "arm"
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    return machine


# LLVM feature name -> the kernel's names for it (any one present is enough). Features not
# listed are not checked (they are not visible to user space, or are implied by others).
_X86 = {name: (name,) for name in (
    "sse", "sse2", "ssse3", "avx", "avx2", "fma", "f16c", "bmi2", "aes", "popcnt", "movbe",
    "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512ifma", "avx512vbmi",
    "vaes", "gfni")}
_X86.update({"sse3": ("pni",), "sse4.1": ("sse4_1",), "sse4.2": ("sse4_2",), "bmi": ("bmi1",),
             "lzcnt": ("abm",), "pclmul": ("pclmulqdq",), "sha": ("sha_ni",),
             "avx512vnni": ("avx512_vnni",), "avx512bf16": ("avx512_bf16",),
             "avx512vbmi2": ("avx512_vbmi2",), "avx512bitalg": ("avx512_bitalg",),
             "avx512vpopcntdq": ("avx512_vpopcntdq",), "avxvnni": ("avx_vnni",),
             "avx512fp16": ("avx512_fp16",), "amx-tile": ("amx_tile",)})
_FEATURE_NAMES = {
    "x86_64": _X86,
    "aarch64": {"neon": ("asimd",), "fp-armv8": ("fp",), "sve": ("sve",), "sve2": ("sve2",),
                "dotprod": ("asimddp",), "fullfp16": ("fphp",), "i8mm": ("i8mm",),
                "bf16": ("bf16",), "crc": ("crc32",), "aes": ("aes",), "sha2": ("sha2",),
                "lse": ("atomics",), "rdm": ("asimdrdm",), "fp16fml": ("asimdfhm",),
                "sme": ("sme",)},
    "arm": {"neon": ("neon",), "vfp2": ("vfp",), "vfp3": ("vfpv3",),
            "vfp3d16": ("vfpv3", "vfpv3d16"), "vfp4": ("vfpv4",), "vfp4d16": ("vfpv4",),
            "d32": ("vfpd32",), "hwdiv-arm": ("idiva",)},
    "riscv64": {letter: (letter,) for letter in "mafdcv"},
}

# Bit positions of the Linux AT_HWCAP / AT_HWCAP2 words (asm/hwcap.h), named as /proc/cpuinfo.
_AARCH64_HWCAP = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
                  "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm "
                  "dit uscat ilrcpc flagm ssbs sb paca pacg").split()
_AARCH64_HWCAP2 = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm "
                   "svef32mm svef64mm svebf16 i8mm bf16 dgh rng bti mte").split()
_ARM_HWCAP = ("swp half thumb 26bit fastmult fpa vfp edsp java iwmmxt crunch thumbee neon "
              "vfpv3 vfpv3d16 tls vfpv4 idiva idivt vfpd32 lpae evtstrm").split()
_AT_HWCAP, _AT_HWCAP2 = 16, 26


def _hwcap_names() -> set[str] | None:
    family = _process_family()
    tables = {"aarch64": ((_AT_HWCAP, _AARCH64_HWCAP), (_AT_HWCAP2, _AARCH64_HWCAP2)),
              "arm": ((_AT_HWCAP, _ARM_HWCAP),)}.get(family)
    if tables is None:
        return None
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    names = set()
    for kind, table in tables:
        word = getauxval(kind)
        names.update(name for bit, name in enumerate(table) if word >> bit & 1)
    return names or None


def _cpuinfo_names() -> set[str] | None:
    family = _process_family()
    key = {"x86_64": "flags", "aarch64": "Features", "arm": "Features",
           "riscv64": "isa"}.get(family)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            if family == "riscv64":
                return _riscv_isa(value.strip())
            return set(value.split())
    return None


def _riscv_isa(isa: str) -> set[str] | None:
    if not isa.startswith("rv64"):
        return None
    base, *extensions = isa[4:].split("_")
    letters = set(base.replace("g", "imafd"))
    return letters | set(extensions)


@functools.lru_cache(maxsize=1)
def cpu_features() -> frozenset | None:
    """This CPU's features as the kernel names them (``asimd``, ``avx2``, ``v``...), or None
    when they cannot be read here."""
    names = _hwcap_names()
    if names is None:
        names = _cpuinfo_names()
    return frozenset(names) if names is not None else None
