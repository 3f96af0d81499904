"""An emulated board: the kernelrpc device server under qemu-user, on a Python-only root.

``python -m kernelrpc.deploy emulate --arch aarch64 --tracker HOST:PORT --key KEY`` prepares
(or reuses) the root file system of :mod:`kernelrpc.deploy.rootfs` and then *becomes* the
device server: the process replaces itself with ``qemu-<arch>-static -L ROOT python3 -m
kernelrpc.server ...``, so the server's ready line, its logging and its handling of
SIGTERM/SIGINT are those of any other device server, and stopping the process stops
the board. The server runs from this kernelrpc's source directory, or from a bundle
(``--bundle kernelrpc-device.pyz``), with the root's own Python: no numpy, no llvmlite.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import NoReturn

from .rootfs import Arch, Rootfs, arch_named, prepare

__all__ = ["server_command", "exec_server"]

_SOURCE_ROOT = Path(__file__).resolve().parents[2]     # the directory holding kernelrpc/


def server_command(root: Rootfs, server_args: list[str], *, bundle: str | os.PathLike | None = None,
                   env: dict | None = None) -> tuple[list[str], dict]:
    """``(argv, env)`` that run the device server with ``server_args`` on the emulated root."""
    env = root.env(env)
    env["PYTHONUNBUFFERED"] = "1"
    if bundle is not None:
        bundle = Path(bundle).resolve()
        if not bundle.is_file():
            raise FileNotFoundError(f"no bundle at {bundle} (build one: python -m kernelrpc.deploy bundle)")
        env.pop("PYTHONPATH", None)
        return root.python_argv(str(bundle), *server_args), env
    env["PYTHONPATH"] = str(_SOURCE_ROOT)
    return root.python_argv("-m", "kernelrpc.server", *server_args), env


def exec_server(arch: str | Arch, server_args: list[str], *, cpu: str | None = None,
                bundle: str | os.PathLike | None = None) -> NoReturn:
    """Prepare the root for ``arch`` and replace this process with the emulated server."""
    arch = arch if isinstance(arch, Arch) else arch_named(arch)
    if cpu:
        arch = dataclasses.replace(arch, qemu_cpu=cpu)
    root = prepare(arch)
    argv, env = server_command(root, server_args, bundle=bundle)
    print(f"kernelrpc.deploy: {arch.name} board emulated by {Path(argv[0]).name}"
          f"{' -cpu ' + arch.qemu_cpu if arch.qemu_cpu else ''} on Debian {arch.suite} "
          f"{arch.debian_arch} (Python {arch.python}), root {root.path}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execve(argv[0], argv, env)
