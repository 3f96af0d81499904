"""Server-side global functions, called by name from clients (like TVM's ``testing.echo``)."""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable

from .. import __version__, runtime
from ..runtime import device_info, threads

runtime.preload()  # sessions are forked children: each inherits the loaded runtime

_REGISTRY: dict[str, Callable] = {}


def register(name: str, func: Callable | None = None, *, override: bool = False):
    """Register ``func`` under ``name``; usable as a decorator ``@register("my.func")``."""
    def add(f: Callable) -> Callable:
        if name in _REGISTRY and not override:
            raise KeyError(f"global function {name!r} is already registered")
        _REGISTRY[name] = f
        return f
    return add(func) if func is not None else add


def get(name: str) -> Callable:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LookupError(f"no global function {name!r} on this server; registered: "
                          f"{', '.join(sorted(_REGISTRY))}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


@register("testing.echo")
def _echo(*args):
    """Return the first argument (TVM's ``testing.echo``), or all of them as a list."""
    if len(args) == 1:
        return args[0]
    return list(args)


@register("testing.sleep")
def _sleep(seconds: float):
    time.sleep(min(float(seconds), 3600.0))


@register("runtime.system_info")
def _system_info():
    """JSON text describing the device: machine, system, CPU count, Python version."""
    return json.dumps({"machine": platform.machine(), "system": platform.system(),
                       "cpus": os.cpu_count(), "python": platform.python_version()})


@register("runtime.device_info")
def _device_info():
    """JSON text of :func:`kernelrpc.runtime.device_info.describe`; its ``target`` is the string
    to build kernels for this device (the client's ``remote.target()``)."""
    return json.dumps(device_info.describe())


@register("runtime.board_report")
def _board_report(reset_peak=0):
    """JSON text of :func:`kernelrpc.runtime.device_info.board_report`: the versions, whether the
    board is emulated, and its state now (frequency, temperature, throttling, the session's peak
    resident memory, first lowered to its current size when ``reset_peak``)."""
    return json.dumps(device_info.board_report(version=__version__, reset_peak=bool(reset_peak)))


@register("runtime.module_set_num_threads")
def _module_set_num_threads(module, nthreads):
    """``Module.set_num_threads`` of a loaded module (the client's remote ``set_num_threads``);
    returns the number of threads its pool now has."""
    if not isinstance(module, runtime.Module):
        raise TypeError(f"runtime.module_set_num_threads: argument 0 must be a module handle, "
                        f"got {_kind(module)}")
    return module.set_num_threads(threads.check_num_threads(nthreads))


@register("runtime.config_threadpool")
def _config_threadpool(affinity_mode, nthreads, *cpus):
    """TVM's ``runtime.config_threadpool(affinity_mode, nthreads)`` for this session: every
    module loaded in it, before or after, uses ``nthreads`` threads (0 = the default). The
    session child is a process of its own, so the process-wide setting is the session's."""
    if cpus:
        raise ValueError("runtime.config_threadpool: an explicit CPU list (TVM's third "
                         "argument) is not supported")
    threads.config_threadpool(affinity_mode, nthreads)


def _kind(value) -> str:
    """What a decoded argument is, in the words of the protocol (handles are runtime objects)."""
    if isinstance(value, runtime.Tensor):
        return "a tensor handle"
    if callable(value):
        return "a function handle"
    return type(value).__name__
