"""Toolchains that compile the module runtime and link modules into shared libraries.

One toolchain per target triple, chosen by :func:`find_toolchain`:

* the host's own code: the system C compiler driver (``$CC``, else ``cc``, ``gcc``
  or ``clang`` on ``PATH``);
* another architecture: a cross gcc on ``PATH`` (``aarch64-linux-gnu-gcc``...)
  when the user has one, else ``zig cc`` from the pip-installable ``ziglang``
  package (``pip install '.[cross]'``), pinned to an old glibc symbol
  floor (:data:`GLIBC_FLOORS`) so modules load on old board images.

The same toolchain compiles ``module_runtime.c`` for the target (cached by
:func:`compiled_object`, as are the user's C sources) and links it with the kernels, so the runtime is built
against the target's own C library headers.

Zig builds its C library stubs and compiler_rt on the first link for each
target (about 17 s on 2 cores) and caches them in ``$ZIG_GLOBAL_CACHE_DIR``
(default ``~/.cache/zig``); later links take a fraction of a second.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GLIBC_FLOORS", "Toolchain", "ToolchainError", "cache_dir", "compiled_object",
           "create_shared", "find_host_cc", "find_toolchain"]

log = logging.getLogger(__name__)

_CANDIDATES = ("cc", "gcc", "clang")
_LINK_TIMEOUT_S = 300  # zig's first link for a target builds its libc stubs
#: The oldest glibc whose symbol versions zig links against, per architecture: 2.17 is
#: the first glibc with AArch64 (and covers every armhf board image in use); riscv64
#: appeared in 2.27.
GLIBC_FLOORS = {"aarch64": "2.17", "arm": "2.17", "riscv64": "2.27", "x86_64": "2.17"}
#: GNU cross toolchain prefixes (Debian's gcc-<prefix> packages) and zig's names.
_GNU_PREFIX = {"aarch64": "aarch64-linux-gnu", "arm": "arm-linux-gnueabihf",
               "riscv64": "riscv64-linux-gnu", "x86_64": "x86_64-linux-gnu"}
#: zig links all of compiler_rt (with debug info) when it gets objects; dropping unused
#: sections and symbols takes an armv7 module from ~220 KB to ~9 KB.
_ZIG_LINK_FLAGS = ("-s", "-Wl,--gc-sections")
_RUNTIME_FLAGS = ("-std=gnu11", "-O2", "-fPIC", "-fvisibility=hidden")
_LINK_OPTIONS = ("-Wl,-z,nodelete",)  # pool threads run module code: never unmap it
_INSTALL_HINT = ("pip install ziglang (a complete cross linker; in a kernelrpc checkout "
                 "pip install '.[cross]'), or put {prefix}-gcc on PATH (Debian: apt-get install "
                 "gcc-{prefix})")


class ToolchainError(RuntimeError):
    """No usable compiler/linker was found, or compiling or linking failed."""


@dataclass(frozen=True)
class Toolchain:
    """A C compiler driver for one target.

    Attributes:
        name: what it is, for messages and the module record (``cc``, ``zig cc``...).
        argv: the driver with its target options (``python -m ziglang cc -target ...``).
        runtime_flags: extra options for compiling the runtime (a baseline CPU).
        link_flags: extra options for linking (zig: strip, drop unused sections).
        libc: the C library floor the links are pinned to (``glibc>=2.17``) or
            ``glibc`` when the toolchain's own C library decides it.
    """

    name: str
    argv: tuple[str, ...]
    runtime_flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()
    libc: str = "glibc"

    def compile_c(self, source, output, *options: str) -> Path:
        """Compile one C file into an object."""
        output = Path(output)
        _run([*self.argv, *_RUNTIME_FLAGS, *self.runtime_flags, *options, "-c", str(source), "-o",
              str(output)], f"compiling {Path(source).name}")
        return output

    def link_shared(self, output, objects, options=()) -> Path:
        """Link objects into a shared library (libm and libpthread only)."""
        output = Path(output)
        _run([*self.argv, "-shared", "-fPIC", "-o", str(output), *map(str, objects),
              *self.link_flags, *_LINK_OPTIONS, *options, "-lm", "-lpthread"],
             f"linking {output.name}")
        return output

    def identity(self) -> str:
        """What decides the compiled bytes: the command and the compiler's version."""
        return "\0".join([*self.argv, *self.runtime_flags, _version(self.argv)])


def find_host_cc() -> list[str]:
    """The command (argv prefix) of the host C compiler driver.

    Raises:
        ToolchainError: ``$CC`` names a missing program, or none of cc/gcc/clang is on PATH.
    """
    env_cc = os.environ.get("CC", "").strip()
    if env_cc:
        argv = shlex.split(env_cc)
        if shutil.which(argv[0]) is None:
            raise ToolchainError(f"$CC is set to {env_cc!r} but {argv[0]!r} is not on PATH")
        return argv
    for name in _CANDIDATES:
        path = shutil.which(name)
        if path:
            return [path]
    raise ToolchainError(
        "no C compiler found to link the shared library: install one (e.g. "
        "`apt-get install gcc` or `clang`) or set $CC to its path")


def _arch_family(triple: str) -> str:
    arch = triple.split("-", 1)[0]
    if arch.startswith(("arm", "thumb")):
        return "arm"
    return arch


def find_toolchain(target) -> Toolchain:
    """The toolchain for a :class:`~kernelrpc.compiler.target.Target`.

    Raises:
        ToolchainError: none is installed; the message says what to install.
    """
    if target.is_host:
        argv = tuple(find_host_cc())
        return Toolchain(os.path.basename(argv[0]), argv)
    family = _arch_family(target.triple)
    prefix = _GNU_PREFIX.get(family)
    if prefix is None or "linux" not in target.triple:
        raise ToolchainError(f"no toolchain is known for {target.triple}: kernelrpc cross-links "
                             f"for Linux on {', '.join(sorted(_GNU_PREFIX))}; pass fcompile=")
    if family == "arm" and target.float_abi != "hard":
        raise ToolchainError(f"{target.triple} is soft-float Arm; kernelrpc links hard-float "
                             "(...-linux-gnueabihf) modules only; pass fcompile=")
    if family == "riscv64" and target.abi != "lp64d":
        raise ToolchainError(f"{target} uses the {target.abi} float ABI, but riscv64 Linux C "
                             "libraries are lp64d: give -mattr with +f,+d (or none for RV64GC)")
    gcc = shutil.which(f"{prefix}-gcc")
    if gcc:
        return Toolchain(f"{prefix}-gcc", (gcc,))
    if not zig_installed():
        raise ToolchainError(f"no linker for {target.triple}: "
                             + _INSTALL_HINT.format(prefix=prefix))
    floor = GLIBC_FLOORS[family]
    abi = "gnueabihf" if family == "arm" else "gnu"
    # The link gets the baseline CPU too: zig builds compiler_rt (memcpy, __aeabi_*) for the
    # CPU it links for, by default one with NEON, which traps on VFPv3-D16 boards.
    cpu = _zig_baseline_cpu(target.triple)
    return Toolchain("zig cc", (sys.executable, "-m", "ziglang", "cc", "-target",
                                f"{family}-linux-{abi}.{floor}"),
                     runtime_flags=cpu, link_flags=(*_ZIG_LINK_FLAGS, *cpu),
                     libc=f"glibc>={floor}")


def _zig_baseline_cpu(triple: str) -> tuple[str, ...]:
    """zig's CPU option for code that runs on every board of the triple: the runtime is built
    for the architecture's baseline, not for the kernels' CPU (armv7: VFPv3-D16 without NEON,
    as Debian's armhf; armv6: the Raspberry Pi 1/Zero's ARM1176). Elsewhere zig's default
    (ARMv8-A, RV64GC) is that baseline."""
    arch = triple.split("-", 1)[0]
    if not arch.startswith(("arm", "thumb")):
        return ()
    return ("-mcpu=arm1176jzf_s",) if arch.startswith("armv6") else (
        "-mcpu=generic+v7a+vfp3d16-neon",)


def zig_installed() -> bool:
    """Whether the ``ziglang`` package (the ``cross`` extra) is importable."""
    return importlib.util.find_spec("ziglang") is not None


def cache_dir() -> Path:
    """kernelrpc's cache: ``$KERNELRPC_CACHE_DIR``, else ``$XDG_CACHE_HOME/kernelrpc``,
    else ``~/.cache/kernelrpc``."""
    explicit = os.environ.get("KERNELRPC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernelrpc"


def compiled_object(toolchain: Toolchain, source) -> Path:
    """``source`` compiled by ``toolchain``, cached on disk per source path and toolchain.

    The entry records the SHA-256 of the source, of every header it includes (the compiler
    lists them: ``-MMD``) and of the object; it is used only while all of them still match, so
    an edited source or header compiles afresh. Concurrent builders each write whole files."""
    source = Path(source).resolve()
    key = hashlib.sha256(f"{source}\0{toolchain.identity()}".encode()).hexdigest()[:24]
    directory = cache_dir() / "objects"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        directory = Path(tempfile.mkdtemp(prefix="kernelrpc-objects-"))
        log.warning("cache directory %s is not usable (%s); compiling %s into %s",
                    cache_dir(), exc, source.name, directory)
    path = directory / f"{source.stem}-{key}.o"
    record = path.with_suffix(".json")
    if _still_valid(path, record):
        return path
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".o.tmp")
    os.close(fd)
    deps = tmp + ".d"
    try:
        inputs = {str(source): _digest(source)}  # before compiling: an edit meanwhile recompiles
        toolchain.compile_c(source, tmp, "-MMD", "-MF", deps)
        for header in _make_dependencies(Path(deps).read_text()):
            inputs.setdefault(str(header), _digest(header))
        os.replace(tmp, path)
        _write_whole(record, json.dumps({"inputs": inputs, "object": _digest(path)}))
    finally:
        for leftover in (tmp, deps):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path


def _digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _still_valid(path: Path, record: Path) -> bool:
    try:
        entry = json.loads(record.read_text())
        return (entry["object"] == _digest(path)
                and all(_digest(p) == want for p, want in entry["inputs"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _make_dependencies(text: str) -> list[Path]:
    """The prerequisites of a make rule as ``-MD`` writes it (``obj: a.c b.h \\``, spaces in
    names escaped)."""
    _, _, prerequisites = text.replace("\\\n", " ").partition(": ")
    names = re.split(r"(?<!\\)\s+", prerequisites.strip())
    return [Path(n.replace("\\ ", " ").replace("$$", "$")) for n in names if n]


def _write_whole(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def create_shared(output: str | os.PathLike, objects: list[str | os.PathLike],
                  cc: list[str] | None = None, options: list[str] | tuple[str, ...] = ()) -> Path:
    """Link ``objects`` into the shared library ``output`` with the host ``cc`` (or ``cc``).

    Raises:
        ToolchainError: the linker is missing or reports an error (its output is included).
    """
    argv = tuple(cc or find_host_cc())
    return Toolchain(argv[0], argv).link_shared(output, objects, options)


@functools.lru_cache(maxsize=None)
def _version(argv: tuple[str, ...]) -> str:
    if argv[1:4] == ("-m", "ziglang", "cc"):
        from importlib.metadata import version

        return "ziglang " + version("ziglang")
    try:
        proc = subprocess.run([*argv, "--version"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.decode(errors="replace").split("\n", 1)[0]


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=_LINK_TIMEOUT_S, check=False)
    except OSError as exc:
        raise ToolchainError(f"{what}: cannot run {cmd[0]!r}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} took more than {_LINK_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed ({shlex.join(cmd)}):\n"
                             + proc.stdout.decode(errors="replace").strip())
