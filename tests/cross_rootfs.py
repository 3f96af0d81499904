"""Test-only: a Python-only root file system per architecture, and running a module in it.

``rootfs(arch)`` unpacks the few Debian packages that make a working ``python3``
(libc6, libgcc-s1, pythonX.Y-minimal, libpythonX.Y-minimal, libpythonX.Y-stdlib,
libffi8, libexpat1, zlib1g) into ``~/.cache/kernelrpc/rootfs-tests/<debian-arch>``
(``$KERNELRPC_TEST_ROOTFS`` moves it), with apt running on a private state directory
(its own sources list, lists, cache and an empty dpkg status: the host's apt and
dpkg are untouched, no root needed). A finished root has a ``.complete`` marker;
a lock file serialises concurrent preparers. ``run_in_rootfs`` runs the target's
Python under ``qemu-<arch>-static -L ROOT`` with this tree's ``src`` on
``PYTHONPATH`` (qemu falls back to host paths), so the device side is exactly
``kernelrpc.runtime`` loading the module with ctypes.

The deploy tooling (``kernelrpc.deploy``) grows the user-facing version of this.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MIRROR = os.environ.get("KERNELRPC_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@dataclass(frozen=True)
class Board:
    arch: str            # kernelrpc's name for the tests: aarch64, armv7, riscv64
    debian: str          # Debian's architecture name
    suite: str           # a Debian release that has the port
    python: str
    qemu: str
    qemu_cpu: str = ""


BOARDS = {
    # a Cortex-A72 (Raspberry Pi 4): NEON, no SVE
    "aarch64": Board("aarch64", "arm64", "bookworm", "3.11", "qemu-aarch64-static", "cortex-a72"),
    "armv7": Board("armv7", "armhf", "bookworm", "3.11", "qemu-arm-static"),
    # bookworm has no riscv64 port
    "riscv64": Board("riscv64", "riscv64", "trixie", "3.13", "qemu-riscv64-static"),
}


class Unavailable(RuntimeError):
    """qemu or apt-get is missing, or Debian's archive cannot be reached."""


def cache_root() -> Path:
    explicit = os.environ.get("KERNELRPC_TEST_ROOTFS")
    if explicit:
        return Path(explicit)
    return Path(os.path.expanduser("~")) / ".cache" / "kernelrpc" / "rootfs-tests"


def rootfs(arch: str) -> Path:
    """The prepared root of ``arch`` (prepared once, then cached)."""
    board = BOARDS[arch]
    for tool in (board.qemu, "apt-get", "dpkg-deb", "tar"):
        if shutil.which(tool) is None:
            raise Unavailable(f"{tool} is not installed (apt-get install qemu-user-static "
                              "provides the emulators)")
    root = cache_root() / board.debian
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(str(root) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".complete").exists():
            _prepare(board, root)
    return root


def _prepare(board: Board, root: Path) -> None:
    apt = Path(str(root) + ".apt")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(apt, ignore_errors=True)
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (apt / sub).mkdir(parents=True)
    (apt / "sources.list").write_text(f"deb [arch={board.debian}] {MIRROR} {board.suite} main\n")
    (apt / "status").write_text("")
    options = [f"-oDir::Etc::SourceList={apt}/sources.list", "-oDir::Etc::SourceParts=/nonexistent",
               f"-oDir::State::Lists={apt}/lists", f"-oDir::State::status={apt}/status",
               f"-oDir::Cache={apt}/cache", f"-oAPT::Architecture={board.debian}",
               f"-oAPT::Architectures::={board.debian}", "-oDebug::NoLocking=1", "-qq"]
    py = board.python
    packages = ["libc6", "libgcc-s1", f"python{py}-minimal", f"libpython{py}-minimal",
                f"libpython{py}-stdlib", "libffi8", "libexpat1", "zlib1g"]
    for cmd in (["apt-get", *options, "update"], ["apt-get", *options, "download", *packages]):
        proc = subprocess.run(cmd, cwd=apt / "debs", capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise Unavailable(f"{' '.join(cmd[:1] + cmd[-len(packages):] if 'download' in cmd else cmd[:1])}"
                              f" failed: {proc.stderr.strip()[-500:]}")
    root.mkdir()
    for deb in sorted((apt / "debs").glob("*.deb")):
        unpack = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "--keep-directory-symlink", "-C", str(root)],
                       stdin=unpack.stdout, check=True)
        if unpack.wait() != 0:
            raise Unavailable(f"dpkg-deb could not unpack {deb.name}")
    for link in ("lib", "bin"):           # merged-/usr releases ship only usr/lib, usr/bin
        if not (root / link).exists():
            (root / link).symlink_to(f"usr/{link}")
    shutil.rmtree(apt)
    (root / ".complete").write_text("")


def run_in_rootfs(arch: str, args: list[str], timeout: float = 300, stdin: str | None = None,
                  env: dict | None = None, cpu: str | None = None) -> subprocess.CompletedProcess:
    """Run the target's ``python3`` with ``args`` under qemu-user in the root of ``arch``
    (on the emulated CPU ``cpu``, default the board's)."""
    board = BOARDS[arch]
    root = rootfs(arch)
    child_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(SRC),
                 "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    cmd = [board.qemu, "-L", str(root)]
    if cpu or board.qemu_cpu:
        cmd += ["-cpu", cpu or board.qemu_cpu]
    cmd += [str(root / "usr" / "bin" / f"python{board.python}"), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=child_env)
