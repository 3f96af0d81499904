"""``kernelrpc-device.pyz``: the device server in one file, for boards that have only Python.

The bundle is a zipapp (PEP 441; the standard library's ``zipapp`` writes it) holding
the modules the device server imports and nothing else: the server, its tracker
registration and proxy mode, the session protocol and the module runtime. The set
is the static import closure of the server's entry points (``modulefinder``, which
also sees imports inside functions), so a new server module is picked up without a
list to keep, and building fails if that closure reaches a host-only part (the
compiler, the tracker, the proxy).

Run it as ``python3 kernelrpc-device.pyz --tracker HOST:PORT --key KEY``, with the
flags of ``python -m kernelrpc.server``.
"""
from __future__ import annotations

import modulefinder
import os
import tempfile
import zipapp
from pathlib import Path

__all__ = ["BundleError", "MIN_PYTHON", "build_bundle", "device_modules"]

MIN_PYTHON = (3, 9)
"""Oldest Python the device runtime supports (Debian 11 / Raspberry Pi OS "bullseye")."""

ENTRY_POINTS = ("kernelrpc.server.__main__", "kernelrpc.server.registration",
                "kernelrpc.server.through_proxy", "kernelrpc.server.session",
                "kernelrpc.runtime")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]          # .../kernelrpc

_MAIN = f'''\
"""kernelrpc device server (bundle): python3 kernelrpc-device.pyz --help"""
import sys

if sys.version_info < {MIN_PYTHON!r}:
    sys.exit("kernelrpc-device needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer; this is Python "
             + sys.version.split()[0])

from kernelrpc.server.__main__ import command

sys.exit(command())
'''


class BundleError(RuntimeError):
    """The device server's import closure reaches a host-only part of kernelrpc."""


def device_modules() -> dict[str, Path]:
    """``{module name: source file}`` for every kernelrpc module the device server imports.

    Only kernelrpc's own directory and the standard library are searched, so an optional
    import inside a function (``Tensor.numpy`` imports numpy) is seen as missing, not bundled.
    """
    finder = modulefinder.ModuleFinder(path=[str(_PACKAGE_DIR.parent), *_stdlib_path()])
    for name in ENTRY_POINTS:
        finder.import_hook(name)
    found = {name: Path(module.__file__) for name, module in finder.modules.items()
             if name.split(".")[0] == "kernelrpc" and module.__file__}
    host_only = sorted(name for name in found if name.split(".")[:2] in (["kernelrpc", n] for n in _HOST_ONLY))
    if host_only:
        raise BundleError("the device runtime imports host-only modules: " + ", ".join(host_only))
    return found


_HOST_ONLY = ("compiler", "te", "deploy", "tracker", "proxy", "nd", "rpc")


def _stdlib_path() -> list[str]:
    import sysconfig

    paths = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    dynload = os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload")
    return [p for p in (*paths, dynload) if p and os.path.isdir(p)]


def build_bundle(out: str | os.PathLike) -> Path:
    """Write the device server zipapp to ``out`` (made executable) and return its path."""
    out = Path(out)
    modules = device_modules()
    with tempfile.TemporaryDirectory(prefix="kernelrpc-bundle-") as staging:
        staging = Path(staging)
        for path in modules.values():
            rel = path.relative_to(_PACKAGE_DIR.parent)
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
        (staging / "__main__.py").write_text(_MAIN)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        zipapp.create_archive(staging, tmp, interpreter="/usr/bin/env python3", compressed=True)
        os.replace(tmp, out)
    return out
