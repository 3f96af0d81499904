"""Python-only root file systems of other architectures, unpacked from Debian's packages.

A root file system here is the handful of Debian packages that make a working
``python3`` (C library, interpreter, standard library, libffi, OpenSSL), unpacked
into a directory and run with qemu-user (``qemu-aarch64-static -L ROOT``). It is
enough for the kernelrpc device server, which needs only the standard library.

Why not debootstrap: its first stage does not unpack ``--include`` packages and its
second stage needs binfmt_misc; the packages unpacked directly take seconds and a
tenth of the space. apt runs with a private state directory (its own sources list,
lists, cache and an empty dpkg status), so the host's apt and dpkg stay untouched
and no root rights are needed.

Each root is cached under ``$KERNELRPC_ROOTFS_CACHE`` (default
``~/.cache/kernelrpc/rootfs``) in ``<debian-arch>-<release>/`` (``arm64-bookworm``), with
its standard library precompiled into the root's ``.pycache`` (emulated start-ups then skip
compiling it). Debian's archive signatures are checked by apt, with Debian's keyring.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["ARCHES", "Arch", "Rootfs", "RootfsError", "ToolMissing", "DownloadFailed",
           "QemuMissing", "cache_root", "find_qemu", "prepare", "arch_named"]

MIRROR_ENV = "KERNELRPC_DEBIAN_MIRROR"
CACHE_ENV = "KERNELRPC_ROOTFS_CACHE"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
LAYOUT_VERSION = 2          # bump when the unpacked layout changes; older caches are rebuilt
_APT_TIMEOUT_S = 300
_COMPILE_TIMEOUT_S = 600
QEMU_PACKAGE_HINT = "install qemu-user-static (Debian/Ubuntu: apt-get install qemu-user-static)"


class RootfsError(RuntimeError):
    """A root file system could not be prepared; the message says what to do."""


class ToolMissing(RootfsError):
    """A host program the preparation needs (apt-get, dpkg-deb, tar) is not installed."""


class QemuMissing(ToolMissing):
    """The qemu-user emulator for an architecture is not installed."""


class DownloadFailed(RootfsError):
    """Debian's package index or a package could not be downloaded (no network, bad mirror)."""


@dataclasses.dataclass(frozen=True)
class Arch:
    """One emulated board kind: which Debian port and release, which qemu."""

    name: str               # what ``uname -m`` says on such a board, e.g. aarch64, armv7l
    debian_arch: str        # Debian's name: arm64, armhf, riscv64
    suite: str              # Debian release carrying the port
    python: str             # the release's Python, e.g. "3.11"
    qemu: str               # the qemu-user program
    qemu_cpu: str = ""      # -cpu for qemu ("" = qemu's default)
    libssl: str = "libssl3"
    libffi: str = "libffi8"
    extra: tuple[str, ...] = ()

    @property
    def packages(self) -> tuple[str, ...]:
        py = self.python
        return ("libc6", "libgcc-s1", f"python{py}-minimal", f"libpython{py}-minimal",
                f"libpython{py}-stdlib", self.libffi, "libexpat1", "zlib1g", self.libssl, *self.extra)


ARCHES: dict[str, Arch] = {
    # The CPUs of a Raspberry Pi 4 (Cortex-A72) and a Raspberry Pi 2 (Cortex-A7: NEON, VFPv4).
    # qemu's default "max" would also emulate pointer authentication, 3x slower for binaries
    # built with it (trixie's); use "max,pauth-impdef=on" if you want max.
    "aarch64": Arch("aarch64", "arm64", "bookworm", "3.11", "qemu-aarch64-static", "cortex-a72"),
    "armv7": Arch("armv7l", "armhf", "bookworm", "3.11", "qemu-arm-static", "cortex-a7"),
    # Debian 12 has no riscv64 port; Debian 13 does (64-bit time_t: libssl3t64, which needs zstd).
    "riscv64": Arch("riscv64", "riscv64", "trixie", "3.13", "qemu-riscv64-static", "",
                    "libssl3t64", extra=("libzstd1",)),
}
_ALIASES = {"arm64": "aarch64", "armhf": "armv7", "armv7l": "armv7", "arm": "armv7"}


def arch_named(name: str) -> Arch:
    """The :class:`Arch` for ``aarch64``/``armv7``/``riscv64`` (or Debian's names)."""
    key = _ALIASES.get(name, name)
    if key not in ARCHES:
        raise RootfsError(f"no emulated board for architecture {name!r}; "
                          f"choose one of {', '.join(ARCHES)}")
    return ARCHES[key]


def cache_root() -> Path:
    """Where prepared roots live: ``$KERNELRPC_ROOTFS_CACHE`` or ``~/.cache/kernelrpc/rootfs``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kernelrpc" / "rootfs"


def find_qemu(arch: Arch) -> str:
    """Path of the qemu-user program for ``arch``; :class:`QemuMissing` names the package."""
    path = shutil.which(arch.qemu) or shutil.which(arch.qemu.removesuffix("-static"))
    if path is None:
        raise QemuMissing(f"{arch.qemu} is not on PATH, so {arch.name} code cannot be emulated: "
                          + QEMU_PACKAGE_HINT)
    return path


@dataclasses.dataclass(frozen=True)
class Rootfs:
    """A prepared root: run its Python with :meth:`python_argv` and :meth:`env`."""

    arch: Arch
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "usr" / "bin" / f"python{self.arch.python}"

    @property
    def pycache(self) -> Path:
        return self.path / ".pycache"

    def qemu_argv(self) -> list[str]:
        argv = [find_qemu(self.arch), "-L", str(self.path)]
        if self.arch.qemu_cpu:
            argv += ["-cpu", self.arch.qemu_cpu]
        return argv

    def python_argv(self, *args: str) -> list[str]:
        """``qemu -L ROOT python3.X ARGS...``: the emulated interpreter."""
        return [*self.qemu_argv(), str(self.python), *args]

    def env(self, base: dict | None = None) -> dict:
        """Environment for the emulated Python: bytecode cached in this root's pycache dir.

        ``PYTHONDONTWRITEBYTECODE`` is dropped so the device server's own modules are compiled
        once too; ``PYTHONPYCACHEPREFIX`` keeps every .pyc inside the cache, never beside sources.
        """
        env = dict(os.environ if base is None else base)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("PYTHONHOME", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.pycache)
        return env


def prepare(arch: str | Arch, cache: str | os.PathLike | None = None, *,
            mirror: str | None = None, refresh: bool = False) -> Rootfs:
    """The cached root for ``arch``, downloading and unpacking it first if needed.

    Safe to call from several processes at once (a lock file serialises preparation).

    Raises:
        QemuMissing: qemu-user for ``arch`` is not installed.
        ToolMissing: apt-get, dpkg-deb or tar is missing.
        DownloadFailed: Debian's index or a package could not be fetched.
        RootfsError: anything else that went wrong, with the failing command's output.
    """
    arch = arch if isinstance(arch, Arch) else arch_named(arch)
    find_qemu(arch)
    base = Path(cache).expanduser() if cache is not None else cache_root()
    base.mkdir(parents=True, exist_ok=True)
    root = Rootfs(arch, base / _dir_name(arch))
    stamp = _stamp(arch)
    with open(base / f"{root.path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not refresh and _read_stamp(root.path) == stamp:
            return root
        started = time.monotonic()
        log.info("preparing the %s root file system (Debian %s %s) in %s",
                 arch.name, arch.suite, arch.debian_arch, root.path)
        work = Path(tempfile.mkdtemp(prefix=f"{root.path.name}.tmp-", dir=base))
        try:
            tree = work / "root"
            _unpack_packages(arch, work, tree, mirror or os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR)
            _replace(tree, root.path)
            _precompile(root)
            (root.path / _STAMP_FILE).write_text(json.dumps(stamp, sort_keys=True))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.info("%s root file system ready in %.1f s", arch.name, time.monotonic() - started)
    return root


_STAMP_FILE = ".kernelrpc-rootfs.json"


def _dir_name(arch: Arch) -> str:
    return f"{arch.debian_arch}-{arch.suite}"


def _stamp(arch: Arch) -> dict:
    return {"layout": LAYOUT_VERSION, "arch": arch.debian_arch, "suite": arch.suite,
            "packages": list(arch.packages)}


def _read_stamp(path: Path) -> dict | None:
    try:
        return json.loads((path / _STAMP_FILE).read_text())
    except (OSError, ValueError):
        return None


def _require(program: str, package: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise ToolMissing(f"{program} is not on PATH; it is needed to unpack Debian packages "
                          f"(Debian/Ubuntu: apt-get install {package})")
    return path


def _run(argv: list[str], what: str, *, cwd: Path | None = None, timeout: float = _APT_TIMEOUT_S,
         env: dict | None = None) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RootfsError(f"{what} took more than {timeout:g} s") from None
    if proc.returncode != 0:
        raise RootfsError(f"{what} failed (exit {proc.returncode}):\n{_tail(proc.stdout)}")
    return proc.stdout


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _unpack_packages(arch: Arch, work: Path, tree: Path, mirror: str) -> None:
    apt_get = _require("apt-get", "apt")
    dpkg_deb = _require("dpkg-deb", "dpkg")
    _require("tar", "tar")
    state = work / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "debs"):
        (state / sub).mkdir(parents=True)
    signed_by = f" signed-by={DEBIAN_KEYRING}" if os.path.exists(DEBIAN_KEYRING) else ""
    (state / "sources.list").write_text(
        f"deb [arch={arch.debian_arch}{signed_by}] {mirror} {arch.suite} main\n")
    (state / "status").write_text("")
    options = []
    for key, value in (("Dir::Etc::SourceList", state / "sources.list"),
                       ("Dir::Etc::SourceParts", "/nonexistent"), ("Dir::Etc::Preferences", "/nonexistent"),
                       ("Dir::Etc::PreferencesParts", "/nonexistent"),
                       ("Dir::State::Lists", state / "lists"), ("Dir::State::status", state / "status"),
                       ("Dir::Cache", state / "cache"), ("APT::Architecture", arch.debian_arch),
                       ("APT::Architectures::", arch.debian_arch), ("Acquire::Retries", "2"),
                       ("Debug::NoLocking", "1")):
        options += ["-o", f"{key}={value}"]
    if os.geteuid() == 0:     # apt would drop to user _apt, who cannot write our private state
        options += ["-o", "APT::Sandbox::User=root"]
    where = f"{mirror} {arch.suite} ({arch.debian_arch})"
    try:
        out = _run([apt_get, *options, "-q", "update"], f"apt-get update for {where}")
    except RootfsError as exc:
        if "NO_PUBKEY" in str(exc) or "is not signed" in str(exc):
            raise ToolMissing(f"apt cannot check the signature of {where}: install Debian's archive "
                              f"keyring (apt-get install debian-archive-keyring; it provides "
                              f"{DEBIAN_KEYRING}).\n{exc}") from None
        raise DownloadFailed(f"cannot download Debian's package index from {where}; check the network "
                             f"or set ${MIRROR_ENV} to a reachable mirror.\n{exc}") from None
    if not any((state / "lists").glob("*Packages*")):
        raise DownloadFailed(f"apt-get update fetched no package index from {where}; check the network "
                             f"or set ${MIRROR_ENV}.\n{_tail(out)}")
    debs = state / "debs"
    try:
        _run([apt_get, *options, "-q", "download", *arch.packages], f"downloading {len(arch.packages)} "
             f"packages from {where}", cwd=debs)
    except RootfsError as exc:
        raise DownloadFailed(str(exc)) from None
    tree.mkdir()
    for deb in sorted(debs.glob("*.deb")):
        # Through tar, not dpkg -x: dpkg -x replaces the merged-/usr symlinks (lib -> usr/lib)
        # with directories, and then qemu cannot find the ELF interpreter /lib/ld-linux-*.so.
        with subprocess.Popen([dpkg_deb, "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as fsys:
            tar = subprocess.run(["tar", "-x", "--keep-directory-symlink", "-C", str(tree)],
                                 stdin=fsys.stdout, stderr=subprocess.PIPE, text=True, check=False)
            fsys.stdout.close()
        if fsys.returncode != 0 or tar.returncode != 0:
            raise RootfsError(f"unpacking {deb.name} failed: {tar.stderr.strip()}")
    for link in ("lib", "bin", "sbin"):   # trixie's packages ship /usr only (merged /usr)
        if not os.path.lexists(tree / link):
            os.symlink(f"usr/{link}", tree / link)
    _relativize_links(tree)
    (tree / "etc").mkdir(exist_ok=True)
    (tree / "etc" / "ld.so.cache").write_bytes(b"")   # the host's cache names host libraries
    if not (tree / "usr" / "bin" / f"python{arch.python}").exists():
        raise RootfsError(f"the unpacked packages hold no usr/bin/python{arch.python}: "
                          f"{', '.join(sorted(p.name for p in debs.glob('*.deb')))}")


def _relativize_links(tree: Path) -> None:
    """Point absolute symlinks (``/lib64/ld-linux-x86-64.so.2 -> /lib/...``) inside the root:
    the kernel would resolve them against the host's file system."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            link = Path(dirpath) / name
            if link.is_symlink() and os.readlink(link).startswith("/"):
                target = tree / os.readlink(link).lstrip("/")
                link.unlink()
                link.symlink_to(os.path.relpath(target, link.parent))


def _replace(tree: Path, dest: Path) -> None:
    if dest.exists() or dest.is_symlink():
        old = dest.with_name(dest.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tree.rename(dest)


def _precompile(root: Rootfs) -> None:
    """Compile the standard library to .pyc once, under qemu, into the root's pycache dir."""
    stdlib = root.path / "usr" / "lib" / f"python{root.arch.python}"
    started = time.monotonic()
    _run(root.python_argv("-m", "compileall", "-q", "-x", r"/(test|idlelib|tkinter|lib2to3)/",
                          str(stdlib)),
         f"precompiling the {root.arch.name} standard library", timeout=_COMPILE_TIMEOUT_S,
         env=root.env())
    log.info("precompiled the %s standard library in %.1f s", root.arch.name, time.monotonic() - started)
