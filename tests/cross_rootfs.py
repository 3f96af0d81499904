"""Test-only: run Python on an emulated board, in the root file systems of kernelrpc.deploy.

``rootfs(arch)`` is :func:`kernelrpc.deploy.rootfs.prepare` (Debian's packages for a working
``python3``, unpacked once into ``~/.cache/kernelrpc/rootfs``, shared with ``python -m
kernelrpc.deploy emulate``). ``run_in_rootfs`` runs the target's Python under
``qemu-<arch>-static -L ROOT`` with this tree's ``src`` on ``PYTHONPATH`` (qemu falls back
to host paths), so the device side is exactly ``kernelrpc.runtime`` loading the module with
ctypes.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

from kernelrpc.deploy import rootfs as _rootfs

SRC = Path(__file__).resolve().parent.parent / "src"
BOARDS = _rootfs.ARCHES


class Unavailable(RuntimeError):
    """qemu or apt-get is missing, or Debian's archive cannot be reached."""


def _prepare(arch: str) -> _rootfs.Rootfs:
    try:
        return _rootfs.prepare(arch)
    except _rootfs.RootfsError as exc:
        raise Unavailable(str(exc)) from None


def rootfs(arch: str) -> Path:
    """The prepared root of ``arch`` (prepared once, then cached)."""
    return _prepare(arch).path


def run_in_rootfs(arch: str, args: list[str], timeout: float = 300, stdin: str | None = None,
                  env: dict | None = None, cpu: str | None = None) -> subprocess.CompletedProcess:
    """Run the target's ``python3`` with ``args`` under qemu-user in the root of ``arch``
    (on the emulated CPU ``cpu``, default the board's)."""
    root = _prepare(arch)
    if cpu:
        root = dataclasses.replace(root, arch=dataclasses.replace(root.arch, qemu_cpu=cpu))
    child_env = root.env({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(SRC),
                          **(env or {})})
    return subprocess.run(root.python_argv(*args), input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=child_env)
