"""TVM's ``rpc.LocalSession``: the session API, served in this process by the device server's
parts (its workspace rules and its global functions), without a socket.

Code written for a remote device (``remote.upload(lib)``, ``remote.load_module(name)``,
``remote.cpu(0)``, ``nd.array(x, dev)``, ``mod.time_evaluator(...)``) runs unchanged with a
LocalSession, so "local or remote" needs no branches. Files go to a private workspace
directory (the same confinement rules as a device server's), removed on ``close()``; global
functions are the device server's registry (``testing.echo``, ``runtime.system_info``, ...).
"""
from __future__ import annotations

import os
import shutil

from .. import runtime
from ..runtime import Device, Tensor, load_module
from . import registry
from .workspace import Workspace


class LocalSession:
    """A session with this process; use as a context manager, or call :meth:`close`."""

    def __init__(self) -> None:
        self.workspace = Workspace.create()
        self.address = "local"
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"workspace {self.workspace.root}"
        return f"<LocalSession {state}>"

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove the workspace (modules loaded from it stay loaded)."""
        if not self._closed:
            self._closed = True
            self.workspace.remove()

    def _live(self):
        if self._closed:
            raise ValueError("the local session is closed")
        return self.workspace

    def cpu(self, dev_id: int = 0) -> Device:
        return runtime.cpu(dev_id)

    def device(self, dev_type="cpu", dev_id: int = 0) -> Device:
        return Device(dev_type, dev_id)

    def get_function(self, name: str):
        """A global function of the device server's registry, e.g. ``"testing.echo"``."""
        return registry.get(name)

    def list_global_func_names(self) -> list[str]:
        return registry.names()

    def upload(self, data, target: str | None = None) -> None:
        """Copy bytes, or the file at a path, to ``target`` in the workspace."""
        workspace = self._live()
        if isinstance(data, (str, os.PathLike)):
            target = target or os.path.basename(os.fspath(data))
            _, out = workspace.open_for_upload(target)
            with out, open(data, "rb") as source:
                shutil.copyfileobj(source, out)
            return
        if target is None:
            raise ValueError("upload of bytes needs a target name")
        _, out = workspace.open_for_upload(target)
        with out:
            out.write(memoryview(data).cast("B"))

    def download(self, name: str) -> bytearray:
        return bytearray(self._live().existing_file(name).read_bytes())

    def remove(self, name: str) -> None:
        self._live().remove_file(name)

    def listdir(self, path: str = "") -> list[str]:
        return self._live().listdir(path)

    def load_module(self, name: str):
        """Load a module uploaded to the workspace (a ``kernelrpc.runtime.Module``)."""
        return load_module(str(self._live().existing_file(name)))

    def empty(self, shape, dtype="float32", dev: Device | None = None) -> Tensor:
        return runtime.empty(shape, dtype, dev or self.cpu(0))

    def array(self, source, dev: Device | None = None) -> Tensor:
        """A tensor holding a copy of ``source`` (needs numpy, as the remote session's does)."""
        from .. import nd

        return nd.array(source, dev or self.cpu(0))
