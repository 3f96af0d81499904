"""Sessions of a server started as root run as an unprivileged user (``--run-as``).

Uploading a module is running code (its constructors run when it is loaded), so a
session should hold no more rights than it needs. The session child drops to the
user's uid and gid (no supplementary groups) right after the fork, before it reads
a byte from the client; the parent stays root to reap, kill and clean up.
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import sys
import sysconfig
from pathlib import Path

DEFAULT_USER = "nobody"


@dataclasses.dataclass(frozen=True)
class SessionUser:
    name: str
    uid: int
    gid: int

    def can_search(self, directory: str | os.PathLike) -> bool:
        """Whether this user can reach ``directory`` (search permission on it and every parent)."""
        path = Path(directory).resolve()
        for part in (path, *path.parents):
            try:
                st = part.stat()
            except OSError:
                return False
            if st.st_uid == self.uid:
                bit = stat.S_IXUSR
            elif st.st_gid == self.gid:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return False
        return True

    def drop(self) -> None:
        """Become this user for good (in the session child)."""
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)


def session_user(run_as: str | None, workspace_parent: str) -> tuple[SessionUser | None, str | None]:
    """The user sessions run as, or None to keep the server's own (not root, or ``--run-as root``),
    and a warning for the log when the default user had to be given up.

    Raises ValueError for an unknown user, or a ``--run-as`` user that cannot reach what a
    session needs; when the default user cannot, sessions stay root and the warning says why.
    """
    if os.geteuid() != 0:
        if run_as not in (None, "", pwd.getpwuid(os.geteuid()).pw_name):
            raise ValueError(f"--run-as {run_as} needs a server started as root")
        return None, None
    name = run_as or DEFAULT_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"--run-as: no user {name!r} on this system") from None
    if entry.pw_uid == 0:
        return None, None
    user = SessionUser(name, entry.pw_uid, entry.pw_gid)
    problem = unreachable(user, workspace_parent)
    if problem is None:
        return user, None
    if run_as is None:
        return None, (f"sessions run as root: the default session user {name!r} cannot reach {problem}. "
                      "Pass --run-as USER for a user who can (or --run-as root to say you mean it)")
    raise ValueError(f"sessions run as {name!r}, who cannot reach {problem}: choose a user who "
                     f"can, or pass --run-as root to keep sessions as root")


def unreachable(user: SessionUser, workspace_parent: str) -> str | None:
    """What a session needs that ``user`` cannot reach: the workspaces, the interpreter and its
    standard library (a session imports modules lazily), kernelrpc itself; None if nothing."""
    needs = {
        f"the workspace directory {workspace_parent} (choose another --workspace-root)": workspace_parent,
        f"the Python interpreter in {Path(sys.executable).resolve().parent}":
            Path(sys.executable).resolve().parent,
        f"Python's standard library in {sysconfig.get_path('stdlib')}": sysconfig.get_path("stdlib"),
        f"kernelrpc in {Path(__file__).resolve().parents[1]}": Path(__file__).resolve().parents[1],
    }
    for what, directory in needs.items():
        if not user.can_search(directory):
            return what
    return None
