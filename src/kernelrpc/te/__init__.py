"""Tensor expressions, schedules and lowering (the compiler frontend)."""
from __future__ import annotations

from . import expr, ir
from .expr import (all_of as all, any_of as any, call_math, const, floordiv, floormod, indexdiv,
                   indexmod, truncdiv, truncmod)
from .expr import if_then_else, max_value, min_value
from .lower import LowerError, PassContext, lower
from .schedule import Schedule, ScheduleError, Stage, create_schedule
from .tensor import (IterVar, Range, Tensor, TensorError, compute, max, min, placeholder,
                     reduce_axis, sum, var)
from .build import BuiltModule, build  # the backend (LLVM via llvmlite)
from .target import Target

size_var = var


def _math(op):
    def fn(*args):
        return call_math(op, *args)
    fn.__name__ = op
    return fn


exp, exp2, log, log2, log10 = (_math(n) for n in ("exp", "exp2", "log", "log2", "log10"))
sqrt, tanh, sin, cos = (_math(n) for n in ("sqrt", "tanh", "sin", "cos"))
floor, ceil, round, trunc = (_math(n) for n in ("floor", "ceil", "round", "trunc"))
power = _math("pow")
fma = _math("fma")


def abs(x):  # noqa: A001 - TVM's name
    x = expr.convert(x)
    if expr.is_float(x.dtype):
        return call_math("fabs", x)
    return if_then_else(x < 0, -x, x)


def sigmoid(x):
    return 1.0 / (1.0 + exp(-x))


def rsqrt(x):
    return 1.0 / sqrt(x)
