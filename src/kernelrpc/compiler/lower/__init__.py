"""Lowering: schedule -> loop nest -> simplified, vectorized, unrolled IR."""
from __future__ import annotations

from .bounds import check_static_bounds, instrument_bound_checkers
from .interleave import interleave_func
from .parallel import normalize_parallel_func
from .partition import partition_func
from ..tensor import ComputeOp
from .passes import Pass, PassConfigError, PassContext, run_passes
from .schedule_ops import LowerError, ScheduleLowering
from .simplify import simplify_func
from .unroll import unroll_func
from .unswitch import unswitch_func
from .vectorize import vectorize_func
from .verify import verify_vars

#: the pipeline after ScheduleOps, in order
PASSES = [
    Pass("Simplify", lambda f, ctx: simplify_func(f)),
    Pass("InstrumentBoundCheckers", lambda f, ctx: instrument_bound_checkers(f),
         enabled_by="tir.instrument_bound_checkers"),
    Pass("LoopPartition", lambda f, ctx: partition_func(f), opt_level=2),
    Pass("NormalizeParallel", lambda f, ctx: normalize_parallel_func(f)),
    Pass("VectorizeLoop", lambda f, ctx: vectorize_func(f, not ctx.get("disable_vectorize"))),
    Pass("UnrollLoop", lambda f, ctx: unroll_func(f, ctx.get("unroll_max_extent"))),
    Pass("RemoveNoOp", lambda f, ctx: simplify_func(f), opt_level=1),
    Pass("UnswitchLoop", lambda f, ctx: unswitch_func(f), opt_level=2),
    Pass("InterleaveStores", lambda f, ctx: interleave_func(f), opt_level=1),
    Pass("VerifyVars", lambda f, ctx: verify_vars(f)),
]


def lower(sch, args, simple_mode: bool = True, name: str = "main", binds=None):
    """Lower a schedule to a PrimFunc; ``args`` are the tensors (and scalar vars) in call order.

    ``simple_mode`` and ``binds`` are accepted for TVM compatibility: the result is
    always the bare PrimFunc and buffers are always compact.
    """
    if binds:
        raise LowerError("lower: binds= is not supported")
    ctx = PassContext.current()
    schedule_ops = Pass("ScheduleOps", lambda s, c: _schedule_ops(s, args, name))
    return run_passes(sch, [schedule_ops, *PASSES], ctx)


def _schedule_ops(sch, args, name):
    for stage in sch.stages:
        if isinstance(stage.op, ComputeOp):
            check_static_bounds(stage.op)
    return ScheduleLowering(sch, args).run(name)


__all__ = ["PASSES", "LowerError", "Pass", "PassConfigError", "PassContext", "lower"]
