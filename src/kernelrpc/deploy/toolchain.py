"""Linkers that turn relocatable objects into the shared library of docs/module-format.md.

The host toolchain is the system C compiler driver (``$CC``, else ``cc``, ``gcc``
or ``clang`` on ``PATH``); it only links, so any of them will do.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

__all__ = ["ToolchainError", "find_host_cc", "create_shared"]

_CANDIDATES = ("cc", "gcc", "clang")
_LINK_TIMEOUT_S = 120


class ToolchainError(RuntimeError):
    """No usable compiler/linker was found, or linking failed."""


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


def create_shared(output: str | os.PathLike, objects: list[str | os.PathLike],
                  cc: list[str] | None = None, options: list[str] | tuple[str, ...] = ()) -> Path:
    """Link ``objects`` into the shared library ``output`` (libm and libpthread only).

    Raises:
        ToolchainError: the linker is missing or reports an error (its output is included).
    """
    argv = list(cc or find_host_cc())
    output = Path(output)
    cmd = [*argv, "-shared", "-fPIC", "-o", str(output), *map(str, objects), *options,
           "-lm", "-lpthread"]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=_LINK_TIMEOUT_S, check=False)
    except OSError as exc:
        raise ToolchainError(f"cannot run {argv[0]!r}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"linking {output.name} took more than {_LINK_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise ToolchainError(f"linking {output.name} failed ({shlex.join(cmd)}):\n"
                             + proc.stdout.decode(errors="replace").strip())
    return output
