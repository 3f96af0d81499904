"""Ready-made GEMM schedules: TVM's "How to optimize GEMM on CPU" tutorial, step by step, and a
register-blocked microkernel past it.

One copy serves the demo, ``examples/gemm_tutorial.py``, ``bench/gemm.py`` and the tests.
Shapes need not be multiples of the block sizes: tails are guarded and packing pads with zeros.
"""
from __future__ import annotations

from . import tensor as _t
from .expr import if_then_else
from .schedule import create_schedule

TUTORIAL_STEPS = ("baseline", "blocking", "vectorization", "loop_permutation", "array_packing",
                  "block_write_cache", "parallel")


def matmul(M, N, K, dtype="float32"):
    """C[M, N] = A[M, K] @ B[K, N]; returns ``(A, B, C)``."""
    k = _t.reduce_axis((0, K), "k")
    A = _t.placeholder((M, K), name="A", dtype=dtype)
    B = _t.placeholder((K, N), name="B", dtype=dtype)
    C = _t.compute((M, N), lambda x, y: _t.sum(A[x, k] * B[k, y], axis=k), name="C")
    return A, B, C


def packed_matmul(M, N, K, bn):
    """GEMM over B packed as ``packedB[ceil(N/bn)][K][bn]``; returns ``(A, B, packedB, C)``."""
    k = _t.reduce_axis((0, K), "k")
    A = _t.placeholder((M, K), name="A")
    B = _t.placeholder((K, N), name="B")
    nb = (N + bn - 1) // bn
    packedB = _t.compute(
        (nb, K, bn), lambda x, y, z: if_then_else(x * bn + z < N, B[y, x * bn + z], 0.0),
        name="packedB")
    C = _t.compute((M, N), lambda x, y: _t.sum(A[x, k] * packedB[y // bn, k, y % bn], axis=k),
                   name="C")
    return A, B, packedB, C


def tutorial_schedule(step, M, N, K, bn=32, kfactor=4):
    """The schedule of one tutorial step (a name from ``TUTORIAL_STEPS``); returns ``(s, [A, B, C])``."""
    if step not in TUTORIAL_STEPS:
        raise ValueError(f"unknown tutorial step {step!r}; choose from {', '.join(TUTORIAL_STEPS)}")
    if TUTORIAL_STEPS.index(step) < TUTORIAL_STEPS.index("array_packing"):
        A, B, C = matmul(M, N, K)
        s = create_schedule(C.op)
        if step == "baseline":
            return s, [A, B, C]
        mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], bn, bn)
        (kaxis,) = s[C].op.reduce_axis
        ko, ki = s[C].split(kaxis, factor=kfactor)
        if step == "loop_permutation":
            s[C].reorder(mo, no, ko, mi, ki, ni)
        else:
            s[C].reorder(mo, no, ko, ki, mi, ni)
        if step != "blocking":
            s[C].vectorize(ni)
        return s, [A, B, C]
    A, B, packedB, C = packed_matmul(M, N, K, bn)
    s = create_schedule(C.op)
    x, _, z = s[packedB].op.axis
    s[packedB].vectorize(z)
    s[packedB].parallel(x)
    if step == "array_packing":
        mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], bn, bn)
        (kaxis,) = s[C].op.reduce_axis
        ko, ki = s[C].split(kaxis, factor=kfactor)
        s[C].reorder(mo, no, ko, mi, ki, ni)
        s[C].vectorize(ni)
        return s, [A, B, C]
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], bn, bn)
    s[CC].compute_at(s[C], no)
    mc, nc = s[CC].op.axis
    (kaxis,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kaxis, factor=kfactor)
    s[CC].reorder(ko, mc, ki, nc)
    s[CC].vectorize(nc)
    s[CC].unroll(ki)
    if step == "parallel":
        s[C].parallel(mo)
    return s, [A, B, C]


def register_blocked(M, N, K, mr=4, nr=64, lanes=16, pack_per_panel=False):
    """Register-blocked GEMM: an ``mr x nr`` tile of C in vector registers for the whole K loop.

    Threads split the ``nr``-wide panels of packed B (each panel stays in one core's L2); inside
    a panel, the ``mr`` rows and ``nr / lanes`` vectors of the accumulator tile are unrolled, so
    every access to it has a constant offset and LLVM keeps it in registers. ``pack_per_panel``
    packs each panel inside the parallel loop that uses it instead of in a pass of its own.
    """
    A, B, packedB, C = packed_matmul(M, N, K, nr)
    s = create_schedule(C.op)
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], mr, nr)
    s[C].reorder(no, mo, mi, ni)
    s[CC].compute_at(s[C], mo)
    mc, nc = s[CC].op.axis
    (k,) = s[CC].op.reduce_axis
    nco, nci = s[CC].split(nc, factor=lanes)
    s[CC].reorder(k, mc, nco, nci)
    s[CC].unroll(mc)
    s[CC].unroll(nco)
    s[CC].vectorize(nci)
    s[C].vectorize(ni)
    s[C].parallel(no)
    x, _, z = s[packedB].op.axis
    s[packedB].vectorize(z)
    if pack_per_panel:
        s[packedB].compute_at(s[C], no)
    else:
        s[packedB].parallel(x)
    return s, [A, B, C]
