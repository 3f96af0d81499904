"""A session's private directory: every remote file operation is confined to it."""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

MAX_NAME_BYTES = 1024
PREFIX = "kernelrpc-session-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-")


class WorkspaceError(ValueError):
    """A remote path is refused (outside the workspace, missing, too large)."""


class Workspace:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()

    @classmethod
    def create(cls, parent: str | None = None) -> "Workspace":
        """A fresh workspace, named after this (the server's) process so a later server can
        tell it is stale once this one is gone (:func:`remove_stale`)."""
        return cls(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def resolve(self, name: str) -> Path:
        """The real path of ``name`` inside the workspace; refuses anything that leads out."""
        if not isinstance(name, str) or not name or "\0" in name or len(name.encode()) > MAX_NAME_BYTES:
            raise WorkspaceError(f"invalid remote file name {name!r}")
        pure = Path(name)
        if pure.is_absolute():
            raise WorkspaceError(f"remote file names are relative to the session workspace; "
                                 f"{name!r} is absolute")
        if ".." in pure.parts:
            raise WorkspaceError(f"remote file name {name!r} contains '..'")
        real = (self.root / pure).resolve()
        if real != self.root and self.root not in real.parents:
            raise WorkspaceError(f"remote file name {name!r} leads outside the session workspace "
                                 "(through a symbolic link)")
        return real

    def open_for_upload(self, name: str):
        """``(path, file)``: the file opened for writing, created with any missing parents."""
        path = self.resolve(name)
        if path == self.root:
            raise WorkspaceError(f"cannot upload to {name!r}: it is the workspace itself")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(name)  # the parents just created must not have been swapped for links
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        return path, open(os.open(path, flags, 0o644), "wb", buffering=0)

    def existing_file(self, name: str) -> Path:
        path = self.resolve(name)
        if not path.is_file():
            raise WorkspaceError(f"no file {name!r} in the session workspace")
        return path

    def remove_file(self, name: str) -> None:
        path = self.resolve(name)
        if path == self.root:
            raise WorkspaceError("cannot remove the workspace itself")
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            raise WorkspaceError(f"no file {name!r} in the session workspace")

    def listdir(self, name: str = "") -> list[str]:
        path = self.resolve(name) if name else self.root
        if not path.is_dir():
            raise WorkspaceError(f"no directory {name!r} in the session workspace")
        return sorted(os.listdir(path))


def remove_stale(parent: str | None = None) -> list[str]:
    """Remove the workspaces in ``parent`` (default: the temporary directory) that belong to
    this user and to a server process that no longer exists (one killed with -9 leaves its
    sessions' workspaces behind); returns their names."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or _process_exists(int(match.group(1))):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    if removed:
        log.info("removed %d stale session workspaces in %s", len(removed), parent)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
