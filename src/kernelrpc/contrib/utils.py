"""TVM's ``tvm.contrib.utils``: ``tempdir()``, a temporary directory removed when unused."""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref

__all__ = ["TempDirectory", "tempdir"]


class TempDirectory:
    """A fresh directory (``.path``), removed by ``remove()``, on exit of a ``with`` block
    or when the object is garbage-collected."""

    def __init__(self, custom_path: "str | None" = None, keep_for_debug: bool = False):
        if custom_path is not None:
            os.makedirs(custom_path, exist_ok=True)
            self.path = os.path.abspath(custom_path)
        else:
            self.path = tempfile.mkdtemp(prefix="kernelrpc-")
        self._cleanup = (None if keep_for_debug or custom_path is not None
                         else weakref.finalize(self, shutil.rmtree, self.path, True))

    def relpath(self, name: str) -> str:
        """The path of ``name`` inside the directory."""
        return os.path.join(self.path, name)

    def listdir(self) -> list[str]:
        return os.listdir(self.path)

    def remove(self) -> None:
        if self._cleanup is not None:
            self._cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self):
        return f"TempDirectory({self.path!r})"


def tempdir(custom_path: "str | None" = None, keep_for_debug: bool = False) -> TempDirectory:
    return TempDirectory(custom_path, keep_for_debug)
