"""The kernelrpc runtime: devices, tensors, modules and timing. Standard library only, because
it also runs on devices (numpy is imported lazily, by ``Tensor.numpy()`` and ndarray copies).

Names load with their submodule on first use (``dir()`` lists them): a client that needs only
``Device`` does not pay for the module loader, the compatibility checks and the statistics.
A forking server loads them all before its first fork (:func:`preload`).
"""
from __future__ import annotations

import importlib

from ..errors import KernelError, ModuleError
from .device import Device, cpu, device  # eager: the submodule ``device`` must not hide the function

_LAZY = {
    "IncompatibleModuleError": "compat", "LibcTooOldError": "compat",
    "MissingCPUFeaturesError": "compat", "WrongArchitectureError": "compat",
    "DTYPES": "dtype", "DType": "dtype", "parse_dtype": "dtype",
    "TimeEvaluator": "evaluator",
    "Function": "module", "Module": "module", "load_module": "module",
    "ProfileResult": "profile",
    "Tensor": "tensor", "empty": "tensor",
    "config_threadpool": "threads",
}

__all__ = sorted(["Device", "KernelError", "ModuleError", "cpu", "device", *_LAZY])


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value     # later look-ups are plain attribute reads
    return value


def preload() -> None:
    """Load every submodule now, and warm the device conditions' probe. A server that forks a
    child per session calls it once before the first fork, so no child loads code or sets up
    the probe on its first request. (The import statement, not a loop over names, so that the
    device bundle's ``modulefinder`` sees every submodule.)"""
    from . import (buffer, cacheflush, compat, conditions, device_info, dtype,  # noqa: F401
                   evaluator, metadata, module, profile, tensor, threads, timing)
    for name in _LAZY:
        __getattr__(name)
    conditions.warm_up()


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
