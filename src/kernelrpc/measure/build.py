"""Host-side build of one candidate, run inside a build worker (a process pool or a Dask worker).

The candidate travels as cloudpickle bytes, so closures and lambdas written in a notebook can be
built in another process; the worker sends back the shared library's bytes and the argument
records, or the compile error as text (an exception object might not unpickle on the other side).
This code runs on the host only: schedule functions never travel to a device.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import traceback
from pathlib import Path


@dataclasses.dataclass
class BuildOutput:
    library: bytes | None
    args: list            # the entry function's argument records (module metadata)
    seconds: float
    error: str = ""       # "Type: message" of a compile error
    traceback: str = ""
    reused: bool = False  # the library was linked before from the same LLVM IR (``reuse_dir``)


class LinkFiles:
    """The C sources and objects every candidate of a batch links (``measure(sources=, objects=)``).

    Read once on the host when the batch starts, they travel to the build workers with each
    candidate: a worker that sees the same file at the same path (a local process pool) compiles
    it there, so its ``#include "..."`` files are found beside it; a worker on another machine
    (Dask) writes the bytes into its build directory and compiles that copy.
    """

    def __init__(self, sources=(), objects=()) -> None:
        if isinstance(sources, (str, os.PathLike)) or isinstance(objects, (str, os.PathLike)):
            raise TypeError("measure: sources= and objects= take lists of paths")
        self.files = tuple((kind, os.path.abspath(p), Path(p).read_bytes())
                           for kind, paths in (("source", sources), ("object", objects)) for p in paths)

    def __bool__(self) -> bool:
        return bool(self.files)

    def paths(self, directory: str) -> dict:
        """``build()``'s ``sources=``/``objects=`` on this worker."""
        out: dict = {"sources": [], "objects": []}
        for k, (kind, path, data) in enumerate(self.files):
            if not _same_file(path, data):
                path = os.path.join(directory, f"link{k}", os.path.basename(path))
                os.makedirs(os.path.dirname(path))
                Path(path).write_bytes(data)
            out["sources" if kind == "source" else "objects"].append(path)
        return out


def _same_file(path: str, data: bytes) -> bool:
    try:
        return Path(path).read_bytes() == data
    except OSError:
        return False


def dumps_candidate(fn) -> bytes:
    """The candidate's bytes for a build worker (cloudpickle: by value for notebook code)."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("kernelrpc.measure ships schedule functions to build workers with "
                          "cloudpickle: pip install 'kernelrpc[tune]'") from None
    return cloudpickle.dumps(fn)


def build_candidate(payload: bytes, target: str | None, name: str,
                    link: LinkFiles | None = None, reuse_dir: str | None = None) -> BuildOutput:
    """Unpickle a schedule function, call it for ``(schedule, args)`` and build a shared library
    (linking ``link``'s C sources and objects); ``reuse_dir``: see ``compiler.build_library``."""
    start = time.perf_counter()
    try:
        import cloudpickle

        from ..compiler.build import build_library

        fn = cloudpickle.loads(payload)
        produced = fn()
        if isinstance(produced, tuple) and len(produced) == 2:
            s, args = produced
        else:
            raise TypeError(f"a candidate must return (schedule, args), got {type(produced).__name__}")
        with tempfile.TemporaryDirectory(prefix="kernelrpc-measure-") as tmp:
            library, records, reused = build_library(s, args, target=target, name=name,
                                                     reuse_dir=reuse_dir,
                                                     **(link.paths(tmp) if link else {}))
        return BuildOutput(library, records, time.perf_counter() - start, reused=reused)
    except Exception as exc:  # every failure is this candidate's compile error
        return BuildOutput(None, [], time.perf_counter() - start, f"{type(exc).__name__}: {exc}",
                           traceback.format_exc())
