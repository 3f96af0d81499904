"""The kernelrpc runtime: devices, tensors, modules and timing. Standard library only, because
it also runs on devices (numpy is imported lazily, by ``Tensor.numpy()`` and ndarray copies)."""
from __future__ import annotations

from ..errors import KernelError, ModuleError
from .compat import (IncompatibleModuleError, LibcTooOldError, MissingCPUFeaturesError,
                     WrongArchitectureError)
from .device import Device, cpu, device
from .dtype import DTYPES, DType, parse_dtype
from .evaluator import TimeEvaluator
from .module import Function, Module, load_module
from .profile import ProfileResult
from .tensor import Tensor, empty
from .threads import config_threadpool

__all__ = ["DTYPES", "DType", "Device", "Function", "IncompatibleModuleError", "KernelError",
           "LibcTooOldError", "MissingCPUFeaturesError", "Module", "ModuleError", "ProfileResult",
           "Tensor", "TimeEvaluator", "WrongArchitectureError", "config_threadpool", "cpu",
           "device", "empty", "load_module", "parse_dtype"]
