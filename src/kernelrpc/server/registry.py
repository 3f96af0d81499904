"""Server-side global functions, called by name from clients (like TVM's ``testing.echo``)."""
from __future__ import annotations

import json
import os
import platform
import time
from typing import Callable

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
