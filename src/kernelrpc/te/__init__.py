"""TVM's ``tvm.te`` surface: tensor expressions and schedules, under the names TVM users know.

The compiler itself (expressions, schedules, lowering, code generation, build, export) lives in
:mod:`kernelrpc.compiler`; this module is the public face ``from kernelrpc import te`` imports.
"""
from __future__ import annotations

from ..compiler import expr, ir
from ..compiler.expr import (all_of as all, any_of as any, call_math, const, floordiv, floormod,
                              indexdiv, indexmod, truncdiv, truncmod)
from ..compiler.expr import if_then_else, max_value, min_value
from ..compiler.lower import LowerError, PassContext, lower
from ..compiler.schedule import Schedule, ScheduleError, Stage, create_schedule
from ..compiler.tensor import (CommReducer, IterVar, Range, Tensor, TensorError, comm_reducer,
                                compute, extern, max, min, placeholder, reduce_axis, scan, sum,
                                var)
from ..compiler import ir_builder
from ..compiler.tensorize import TensorIntrin, decl_tensor_intrin
from ..compiler.build import BuiltModule, build  # the backend (LLVM via llvmlite)
from ..compiler.target import Target

size_var = var


def _math(op):
    def fn(*args):
        return call_math(op, *args)
    fn.__name__ = op
    return fn


exp, exp2, exp10, log, log2, log10, log1p = (
    _math(n) for n in ("exp", "exp2", "exp10", "log", "log2", "log10", "log1p"))
sqrt, tanh, sinh, cosh, erf = (_math(n) for n in ("sqrt", "tanh", "sinh", "cosh", "erf"))
sin, cos, tan, asin, acos, atan = (_math(n) for n in ("sin", "cos", "tan", "asin", "acos", "atan"))
atan2, hypot, copysign, fmod, ldexp = (
    _math(n) for n in ("atan2", "hypot", "copysign", "fmod", "ldexp"))
floor, ceil, round, trunc, nearbyint = (
    _math(n) for n in ("floor", "ceil", "round", "trunc", "nearbyint"))
isnan, isinf, isfinite = (_math(n) for n in ("isnan", "isinf", "isfinite"))
clz, popcount = _math("clz"), _math("popcount")
power = _math("pow")
fma = _math("fma")
div = truncdiv           # TVM's te.div: C semantics (true division on floats)


def abs(x):  # noqa: A001 - TVM's name
    x = expr.convert(x)
    if expr.is_float(x.dtype):
        return call_math("fabs", x)
    return if_then_else(x < 0, -x, x)


def sigmoid(x):
    return 1.0 / (1.0 + exp(-x))


def rsqrt(x):
    return 1.0 / sqrt(x)
