"""Sessions of a server started as root run as an unprivileged user (``--run-as``).

Uploading a module is running code (its constructors run when it is loaded), so a
session should hold no more rights than it needs. The session child drops to the
user's uid and gid (no supplementary groups) right after the fork, before it reads
a byte from the client; the parent stays root to reap, kill and clean up.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pwd
import stat
from pathlib import Path

log = logging.getLogger(__name__)

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


def session_user(run_as: str | None, workspace_parent: str) -> SessionUser | None:
    """The user sessions run as, or None to keep the server's own (not root, or ``--run-as root``).

    Raises ValueError for an unknown user, or a ``--run-as`` user that could not reach the
    workspaces; the default user that could not is a logged warning, and sessions stay root.
    """
    if os.geteuid() != 0:
        if run_as not in (None, "", pwd.getpwuid(os.geteuid()).pw_name):
            raise ValueError(f"--run-as {run_as} needs a server started as root")
        return None
    name = run_as or DEFAULT_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"--run-as: no user {name!r} on this system") from None
    if entry.pw_uid == 0:
        return None
    user = SessionUser(name, entry.pw_uid, entry.pw_gid)
    if not user.can_search(workspace_parent):
        if run_as is None:
            log.warning("sessions run as root: the default session user %r cannot reach the workspace "
                        "directory %s. Choose a --workspace-root it can search, or pass --run-as USER "
                        "(or --run-as root to say you mean it)", name, workspace_parent)
            return None
        raise ValueError(f"sessions run as {name!r}, who cannot reach the workspace directory "
                         f"{workspace_parent}: choose a --workspace-root that {name!r} can search, "
                         f"or pass --run-as root to keep sessions as root")
    return user
