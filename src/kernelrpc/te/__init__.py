"""TVM's ``tvm.te`` surface: tensor expressions and schedules, under the names TVM users know.

The compiler itself (expressions, schedules, lowering, code generation, build, export) lives in
:mod:`kernelrpc.compiler`; this module is the public face ``from kernelrpc import te`` imports.
"""
from __future__ import annotations

import builtins

from ..compiler import expr, ir
from ..compiler.expr import (all_of as all, any_of as any, call_math, const, floordiv, floormod,
                              indexdiv, indexmod, truncdiv, truncmod)
from ..compiler.expr import if_then_else, max_value, min_value
from ..compiler.lower import LowerError, PassContext, lower
from ..compiler.schedule import (Schedule, ScheduleError, SchedulePrimitiveIgnored, Stage, StageGroup,
                                  create_schedule)
from ..compiler.gradient import GradientError, gradient
from ..compiler.tag import TagScope, tag_scope
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


def nextafter(x, y):
    """The next representable value after ``x`` in the direction of ``y`` (C's nextafter)."""
    x, y = expr.convert(x), expr.convert(y)
    if "float16" in (x.dtype, y.dtype) or x.dtype.startswith("float16"):
        raise expr.DTypeError("nextafter: float16 has no C library function; cast to float32")
    return call_math("nextafter", x, y)


def create_prim_func(ops, name: str = "main"):
    """TVM's ``te.create_prim_func([A, B, ...])``: the PrimFunc of the default schedule with
    these tensors (and scalar vars) as its parameters, in order; ``kernelrpc.build`` takes it.
    The outputs are the given tensors that no other given tensor is computed from."""
    from ..compiler.tensor import PlaceholderOp

    tensors = [t for t in ops if isinstance(t, Tensor)]
    computed = [t for t in tensors if not isinstance(t.op, PlaceholderOp)]
    if not computed:
        raise ScheduleError("create_prim_func: no computed tensor among the arguments")

    def reads(op, target, seen) -> bool:
        if id(op) in seen:
            return False
        seen.add(id(op))
        return builtins.any(t.op is target or reads(t.op, target, seen) for t in op.input_tensors)

    outputs = [t for t in computed
               if not builtins.any(o is not t and reads(o.op, t.op, set()) for o in computed)]
    return lower(create_schedule(outputs), list(ops), name=name)


def abs(x):  # noqa: A001 - TVM's name
    x = expr.convert(x)
    if expr.is_float(x.dtype):
        return call_math("fabs", x)
    return if_then_else(x < 0, -x, x)


def sigmoid(x):
    return 1.0 / (1.0 + exp(-x))


def rsqrt(x):
    return 1.0 / sqrt(x)
