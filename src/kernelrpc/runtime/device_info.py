"""What machine this process runs on, and the LLVM target string to build kernels for it.

Standard library only: it runs on the device (the server sends it to the tracker and
answers ``remote.target()`` with it). Sources, in order of trust:

* ``os.uname().machine`` for the architecture, unless this Python is a 32-bit Arm
  program on a 64-bit kernel (then modules must be 32-bit Arm too);
* the kernel's hardware capability words (``getauxval(AT_HWCAP)``/``AT_HWCAP2``) for the
  CPU features on arm, aarch64 and riscv64: they are what ``/proc/cpuinfo``'s
  ``Features``/``isa`` lines are printed from, and qemu-user sets them for the CPU it
  emulates (its ``/proc/cpuinfo`` is the host's);
* ``/proc/cpuinfo`` for the CPU model (and x86's feature flags), used only when it
  describes this architecture.
"""
from __future__ import annotations

import os
import platform

from . import compat
# Linux's HWCAP bit names (asm/hwcap.h), as /proc/cpuinfo prints them: one table for the
# load-time checks and this description.
from .compat import _AARCH64_HWCAP, _AARCH64_HWCAP2, _ARM_HWCAP

__all__ = ["describe", "target_string", "llvm_target"]

AT_HWCAP, AT_HWCAP2 = 16, 26

# Linux feature name -> LLVM -mattr feature. Only features that change generated code.
_AARCH64_LLVM = {"asimd": "neon", "crc32": "crc", "atomics": "lse", "aes": "aes", "sha2": "sha2",
                 "sha3": "sha3", "asimdrdm": "rdm", "fphp": "fullfp16", "asimddp": "dotprod",
                 "asimdfhm": "fp16fml", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm", "bf16": "bf16",
                 "lrcpc": "rcpc", "jscvt": "jsconv", "fcma": "complxnum"}
_X86_LLVM = {"sse3": "sse3", "pni": "sse3", "ssse3": "ssse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2",
             "popcnt": "popcnt", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
             "bmi1": "bmi", "bmi2": "bmi2", "abm": "lzcnt", "movbe": "movbe", "aes": "aes",
             "pclmulqdq": "pclmul", "avx512f": "avx512f", "avx512cd": "avx512cd",
             "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
             "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16", "avx512ifma": "avx512ifma",
             "avx512vbmi": "avx512vbmi", "avx_vnni": "avxvnni"}
_RISCV_Z = {"zba", "zbb", "zbc", "zbs", "zfh", "zfhmin", "zicond", "zvfh"}

# MIDR implementer 0x41 (Arm) part numbers of common boards' cores -> LLVM cpu name.
_ARM_PARTS = {0xb76: "arm1176jzf-s", 0xc07: "cortex-a7", 0xc08: "cortex-a8", 0xc09: "cortex-a9", 0xc0f: "cortex-a15",
              0xd03: "cortex-a53", 0xd04: "cortex-a35", 0xd05: "cortex-a55", 0xd07: "cortex-a57",
              0xd08: "cortex-a72", 0xd09: "cortex-a73", 0xd0a: "cortex-a75", 0xd0b: "cortex-a76",
              0xd0c: "neoverse-n1", 0xd0d: "cortex-a77", 0xd41: "cortex-a78", 0xd42: "cortex-a78ae",
              0xd44: "cortex-x1", 0xd46: "cortex-a510", 0xd47: "cortex-a710", 0xd49: "neoverse-n2"}
_CPUINFO_ARCH = {"aarch64": ("Features", "CPU implementer"), "arm": ("Features", "CPU implementer"),
                 "riscv64": ("isa",), "x86_64": ("flags",)}


def _family(machine: str) -> str:
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    if machine.startswith("armv") or machine == "arm":
        return "arm"
    if machine in ("x86_64", "amd64"):
        return "x86_64"
    return machine


def _hwcaps() -> tuple[int, int]:
    try:
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
    except (ImportError, OSError, AttributeError):
        return 0, 0
    getauxval.restype = ctypes.c_ulong
    getauxval.argtypes = [ctypes.c_ulong]
    return getauxval(AT_HWCAP), getauxval(AT_HWCAP2)


def _bits(word: int, names: list[str]) -> list[str]:
    return [name for i, name in enumerate(names) if word >> i & 1]


def _read_cpuinfo(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields (and board-wide ones such as ``Model``)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key and key not in fields:
            fields[key] = value.strip()
    return fields


def _process_machine(kernel_machine: str) -> tuple[str, bool]:
    """``(machine, hard_float)`` of this Python process, which is what a module must match:
    a 32-bit Arm userland on a 64-bit kernel (32-bit Raspberry Pi OS on a Pi 4 or 5) has
    ``uname -m`` aarch64 but loads only 32-bit Arm modules."""
    elf = compat.this_process()
    if elf is None or elf.arch != "arm":
        return kernel_machine, True
    machine = kernel_machine if _family(kernel_machine) == "arm" else "armv7l"
    return machine, bool(elf.flags & 0x400)          # EF_ARM_ABI_FLOAT_HARD


def describe(*, machine: str | None = None, cpuinfo_path: str = "/proc/cpuinfo",
             hwcaps: tuple[int, int] | None = None) -> dict:
    """A JSON-ready description of this machine; ``target`` is the string to build for it.

    Keys: ``machine`` (this Python's), ``system``, ``cpus``, ``python``, ``cpu_model``,
    ``features`` (Linux names), ``target``, ``cpu`` (when known), ``kernel_machine`` (when the
    kernel's differs) and ``cpuinfo_foreign`` (true when /proc/cpuinfo describes another
    architecture, as it does under qemu-user). ``machine``, ``cpuinfo_path``
    and ``hwcaps`` stand in for this machine's, to describe another one.
    """
    uname = os.uname()
    kernel_machine, hard_float = machine or uname.machine, True
    if machine is None:
        machine, hard_float = _process_machine(kernel_machine)
    family = _family(machine)
    cpuinfo = _read_cpuinfo(cpuinfo_path)
    own_keys = _CPUINFO_ARCH.get(family, ())
    foreign = bool(cpuinfo) and bool(own_keys) and not any(k in cpuinfo for k in own_keys)
    if foreign:
        cpuinfo = {}
    if hwcaps is None:
        hwcaps = _hwcaps() if family in ("aarch64", "arm", "riscv64") else (0, 0)
    hwcap, hwcap2 = hwcaps
    if family == "aarch64":
        features = _bits(hwcap, _AARCH64_HWCAP) + _bits(hwcap2, _AARCH64_HWCAP2) if hwcap \
            else cpuinfo.get("Features", "").split()
    elif family == "arm":
        features = _bits(hwcap, _ARM_HWCAP) if hwcap else cpuinfo.get("Features", "").split()
    elif family == "riscv64":
        features = _riscv_extensions(cpuinfo.get("isa", ""), hwcap)
    else:
        features = cpuinfo.get("flags", "").split()
    model = cpuinfo.get("model name") or cpuinfo.get("Model") or cpuinfo.get("uarch") or ""
    cpu = _arm_cpu(cpuinfo) if family in ("aarch64", "arm") else ""
    info = {"machine": machine, "system": uname.sysname, "cpus": os.cpu_count() or 1,
            "python": platform.python_version(), "cpu_model": model[:200],
            "features": sorted(set(features))[:256],
            "target": llvm_target(machine, features, cpu=cpu, hard_float=hard_float)}
    if machine != kernel_machine:
        info["kernel_machine"] = kernel_machine
    if cpu:
        info["cpu"] = cpu
    if foreign:
        info["cpuinfo_foreign"] = True
    return info


def _riscv_extensions(isa: str, hwcap: int) -> list[str]:
    """Extension names from ``rv64imafdc_zicsr_zba`` (cpuinfo) or the AT_HWCAP letter bits."""
    isa = isa.lower()
    if isa.startswith("rv64") or isa.startswith("rv32"):
        base, *z = isa[4:].split("_")
        letters = list(base)
        if "g" in letters:
            letters += list("imafd")
        return sorted(set(letters)) + [e for e in z if e]
    return [chr(ord("a") + i) for i in range(26) if hwcap >> i & 1]


def _arm_cpu(cpuinfo: dict) -> str:
    try:
        if int(cpuinfo.get("CPU implementer", ""), 16) == 0x41:
            return _ARM_PARTS.get(int(cpuinfo.get("CPU part", ""), 16), "")
    except ValueError:
        pass
    return ""


def llvm_target(machine: str, features: list[str], *, cpu: str = "", hard_float: bool = True) -> str:
    """The kernelrpc/TVM target string for a machine with these Linux CPU feature names."""
    family = _family(machine)
    have = set(features)
    if family == "aarch64":
        triple = "aarch64-linux-gnu"
        mattr = [f"+{llvm}" for linux, llvm in _AARCH64_LLVM.items() if linux in have]
        if "asimd" not in have and not mattr:
            mattr = ["+neon"]        # every AArch64 Linux machine has Advanced SIMD
    elif family == "arm":
        sub = "armv6" if machine.startswith("armv6") else "armv7"   # armv8l: AArch32 userland
        triple = f"{sub}-linux-gnueabihf" if hard_float else f"{sub}-linux-gnueabi"
        if sub == "armv6":
            mattr = ["+vfp2"] if "vfp" in have else []
        elif "neon" in have:
            mattr = ["+neon"] + (["+vfp4"] if "vfpv4" in have else [])
        else:
            mattr = (["+vfp4"] if "vfpv4" in have else ["+vfp3d16"] if have & {"vfpv3", "vfpv3d16"}
                     else ["+vfp2"] if "vfp" in have else []) + ["-neon"]
    elif family == "riscv64":
        triple = "riscv64-linux-gnu"
        cpu = cpu or "generic-rv64"
        mattr = [f"+{e}" for e in "mafdcv" if e in have] + [f"+{e}" for e in sorted(have & _RISCV_Z)]
    elif family == "x86_64":
        triple = "x86_64-linux-gnu"
        mattr = sorted({f"+{_X86_LLVM[f]}" for f in have if f in _X86_LLVM})
    else:
        return "llvm"
    parts = ["llvm", f"-mtriple={triple}"]
    if cpu:
        parts.append(f"-mcpu={cpu}")
    if mattr:
        parts.append("-mattr=" + ",".join(mattr))
    return " ".join(parts)


def target_string() -> str:
    """The target string to build kernels for this machine (``remote.target()``)."""
    return describe()["target"]

