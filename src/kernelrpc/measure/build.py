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


@dataclasses.dataclass
class BuildOutput:
    library: bytes | None
    args: list            # the entry function's argument records (module metadata)
    seconds: float
    error: str = ""       # "Type: message" of a compile error
    traceback: str = ""


def dumps_candidate(fn) -> bytes:
    """The candidate's bytes for a build worker (cloudpickle: by value for notebook code)."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("kernelrpc.measure ships schedule functions to build workers with "
                          "cloudpickle: pip install 'kernelrpc[tune]'") from None
    return cloudpickle.dumps(fn)


def build_candidate(payload: bytes, target: str | None, name: str) -> BuildOutput:
    """Unpickle a schedule function, call it for ``(schedule, args)`` and build a shared library."""
    start = time.perf_counter()
    try:
        import cloudpickle

        from ..compiler import build

        fn = cloudpickle.loads(payload)
        produced = fn()
        if isinstance(produced, tuple) and len(produced) == 2:
            s, args = produced
        else:
            raise TypeError(f"a candidate must return (schedule, args), got {type(produced).__name__}")
        module = build(s, args, target=target, name=name)
        with tempfile.TemporaryDirectory(prefix="kernelrpc-measure-") as tmp:
            path = module.export_library(os.path.join(tmp, f"{name}.so"))
            library = path.read_bytes()
        records = module.metadata["functions"][0]["args"]
        return BuildOutput(library, records, time.perf_counter() - start)
    except Exception as exc:  # every failure is this candidate's compile error
        return BuildOutput(None, [], time.perf_counter() - start, f"{type(exc).__name__}: {exc}",
                           traceback.format_exc())
