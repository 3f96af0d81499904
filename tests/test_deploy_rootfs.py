"""Preparing root file systems: typed errors a user can act on, and a cache that is reused."""
import os
import shutil
import subprocess
import sys

import pytest

from kernelrpc.deploy import rootfs
from servicectl import child_env


def _path_with(tmp_path, *programs):
    """A PATH holding only links to these host programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in programs:
        os.symlink(shutil.which(name), bin_dir / name)
    return str(bin_dir)


def test_missing_qemu_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "apt-get", "dpkg-deb", "tar"))
    with pytest.raises(rootfs.QemuMissing, match=r"apt-get install qemu-user-static"):
        rootfs.prepare("riscv64", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_missing_qemu_from_the_command_line(tmp_path):
    env = child_env({"PATH": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-m", "kernelrpc.deploy", "emulate", "--arch", "aarch64",
                           "--tracker", "127.0.0.1:9190", "--key", "k"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "qemu-aarch64-static is not on PATH" in proc.stderr
    assert "apt-get install qemu-user-static" in proc.stderr


@pytest.mark.skipif(shutil.which("qemu-aarch64-static") is None, reason="needs qemu-user-static")
def test_missing_apt_get_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_with(tmp_path, "qemu-aarch64-static", "dpkg-deb", "tar"))
    with pytest.raises(rootfs.ToolMissing, match=r"apt-get is not on PATH.*apt-get install apt"):
        rootfs.prepare("aarch64", tmp_path / "cache")


@pytest.mark.skipif(shutil.which("qemu-aarch64-static") is None or shutil.which("apt-get") is None,
                    reason="needs qemu-user-static and apt-get")
def test_unreachable_mirror_is_a_download_error_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(rootfs.DownloadFailed, match=r"check the network") as info:
        rootfs.prepare("aarch64", cache, mirror="http://127.0.0.1:9/debian")
    assert "Connection refused" in str(info.value)
    assert sorted(p.name for p in cache.iterdir()) == ["arm64-bookworm.lock"]


def test_unknown_architecture():
    with pytest.raises(rootfs.RootfsError, match=r"choose one of aarch64, armv7, riscv64"):
        rootfs.arch_named("mips")
    assert rootfs.arch_named("arm64") is rootfs.ARCHES["aarch64"]
    assert rootfs.arch_named("armhf") is rootfs.ARCHES["armv7"]


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELRPC_ROOTFS_CACHE", str(tmp_path / "roots"))
    assert rootfs.cache_root() == tmp_path / "roots"
    monkeypatch.delenv("KERNELRPC_ROOTFS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rootfs.cache_root() == tmp_path / "xdg" / "kernelrpc" / "rootfs"


@pytest.mark.cross
@pytest.mark.parametrize("arch", sorted(rootfs.ARCHES))
def test_prepared_root_runs_its_python_with_a_precompiled_stdlib(arch):
    if shutil.which(rootfs.ARCHES[arch].qemu) is None:
        pytest.skip(rootfs.QEMU_PACKAGE_HINT)
    root = rootfs.prepare(arch)            # the shared cache: prepared once, then reused
    stamp = (root.path / ".kernelrpc-rootfs.json").stat()
    assert rootfs.prepare(arch) == root
    assert (root.path / ".kernelrpc-rootfs.json").stat().st_ino == stamp.st_ino
    assert not [p for p in root.path.rglob("*") if p.is_symlink() and os.readlink(p).startswith("/")]
    assert any(root.pycache.rglob("json/decoder.cpython-*.pyc"))
    proc = subprocess.run(root.python_argv("-c", "import os, sys, ctypes, ssl, json, select; "
                                                 "print(os.uname().machine, '%d.%d' % sys.version_info[:2])"),
                          env=root.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [root.arch.name, root.arch.python]
