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

__all__ = ["board_report", "board_state", "describe", "llvm_target", "target_string"]

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



# -- what a measurement needs besides the target: versions, emulation, the board's state ----------

MAX_CPUS_READ = 1024
MAX_ZONES = 32
# Raspberry Pi firmware's get_throttled bits: now (0-3) and since boot (16-19)
_PI_THROTTLED = {0: "under-voltage", 1: "frequency capped", 2: "throttled", 3: "soft temperature limit"}


def _read_text(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(limit).strip()
    except (OSError, ValueError):
        return None


def _read_int(path: str, base: int = 10) -> int | None:
    text = _read_text(path, 64)
    try:
        return int(text, base) if text else None
    except ValueError:
        return None


def _cpu_dirs(sys_root: str) -> list[str]:
    base = f"{sys_root}/devices/system/cpu"
    try:
        names = [n for n in os.listdir(base) if n.startswith("cpu") and n[3:].isdigit()]
    except OSError:
        return []
    return [f"{base}/{n}" for n in sorted(names, key=lambda n: int(n[3:]))[:MAX_CPUS_READ]]


def _frequency(cpus: list[str]) -> dict:
    """Governors and MHz (current: lowest and highest over the CPUs) from cpufreq, where present."""
    governors, current, lowest, highest = set(), [], [], []
    for cpu in cpus:
        governor = _read_text(f"{cpu}/cpufreq/scaling_governor", 64)
        if governor:
            governors.add(governor[:32])
        for name, into in (("scaling_cur_freq", current), ("scaling_min_freq", lowest),
                           ("scaling_max_freq", highest)):
            khz = _read_int(f"{cpu}/cpufreq/{name}")
            if khz is not None and khz > 0:
                into.append(khz / 1e3)
    out: dict = {}
    if governors:
        out["governor"] = ",".join(sorted(governors))
    if current:
        out["cur_mhz"] = [min(current), max(current)]
    if lowest:
        out["min_mhz"] = min(lowest)
    if highest:
        out["max_mhz"] = max(highest)
    return out


def _temperature(sys_root: str) -> dict:
    """The hottest thermal zone (°C) and every zone's reading, where /sys/class/thermal has them."""
    base = f"{sys_root}/class/thermal"
    try:
        zones = sorted(n for n in os.listdir(base) if n.startswith("thermal_zone"))[:MAX_ZONES]
    except OSError:
        return {}
    readings = {}
    for zone in zones:
        milli = _read_int(f"{base}/{zone}/temp")
        if milli is not None and -50_000 < milli < 200_000:
            kind = (_read_text(f"{base}/{zone}/type", 64) or zone)[:32]
            readings[f"{zone}:{kind}"] = milli / 1e3
    return {"temp_c": max(readings.values()), "zones_c": readings} if readings else {}


def _throttling(sys_root: str, cpus: list[str]) -> dict:
    """What the board says about throttling: a Raspberry Pi's firmware word, or x86's counts of
    thermal throttling events (which only grow: compare before and after)."""
    word = _read_int(f"{sys_root}/devices/platform/soc/soc:firmware/get_throttled", 16)
    if word is not None:
        return {"throttled_now": [name for bit, name in _PI_THROTTLED.items() if word >> bit & 1],
                "throttled_since_boot": [name for bit, name in _PI_THROTTLED.items()
                                         if word >> (bit + 16) & 1]}
    counts = [_read_int(f"{cpu}/thermal_throttle/core_throttle_count") for cpu in cpus]
    counts = [c for c in counts if c is not None]
    return {"throttle_events": sum(counts)} if counts else {}


def _peak_rss(reset: bool, proc_root: str) -> dict:
    """This process's peak resident memory (VmHWM); ``reset`` first lowers the peak to the
    current size (writing 5 to clear_refs), so the next reading is the peak since then."""
    since = "process start"
    if reset:
        try:
            with open(f"{proc_root}/self/clear_refs", "w") as f:
                f.write("5")
            since = "reset"
        except OSError:
            pass
    status = _read_text(f"{proc_root}/self/status", 1 << 16) or ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            try:
                return {"peak_rss_bytes": int(line.split()[1]) * 1024, "peak_rss_since": since}
            except (IndexError, ValueError):
                break
    try:
        import resource
    except ImportError:
        return {}
    return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_rss_since": "process start"}


def board_state(*, reset_peak: bool = False, sys_root: str = "/sys", proc_root: str = "/proc") -> dict:
    """The board's state now: ``governor``, ``cur_mhz`` ([lowest, highest] over the CPUs),
    ``min_mhz``, ``max_mhz``, ``temp_c`` (hottest zone) and ``zones_c``, throttling
    (``throttled_now``/``throttled_since_boot`` or ``throttle_events``), and this process's
    ``peak_rss_bytes``. A key is absent where the system does not expose it (containers, qemu)."""
    cpus = _cpu_dirs(sys_root)
    return {**_frequency(cpus), **_temperature(sys_root), **_throttling(sys_root, cpus),
            **_peak_rss(reset_peak, proc_root)}


def board_report(*, version: str, reset_peak: bool = False) -> dict:
    """:func:`describe` with the versions (``version``: the device server's kernelrpc) and
    whether the board is emulated (``facts``), and :func:`board_state` (``state``): what a
    measurement on this board needs to be trusted."""
    facts = describe()
    uname = os.uname()
    facts.update(hostname=uname.nodename[:64], kernel=uname.release[:128], kernelrpc=version,
                 emulated=bool(facts.get("cpuinfo_foreign")))
    return {"facts": facts, "state": board_state(reset_peak=reset_peak)}
