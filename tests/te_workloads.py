"""Tensor-expression workloads and schedules shared by the compiler tests."""
from __future__ import annotations

from kernelrpc import te


def gemm(M, N, K, dtype="float32"):
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A", dtype=dtype)
    B = te.placeholder((K, N), name="B", dtype=dtype)
    C = te.compute((M, N), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name="C")
    return A, B, C


def packed_gemm(M, N, K, bn):
    """GEMM over B packed as packedB[N/bn][K][bn] (N need not divide: the pad is zero)."""
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    nb = (N + bn - 1) // bn
    packedB = te.compute(
        (nb, K, bn),
        lambda x, y, z: te.if_then_else(x * bn + z < N, B[y, x * bn + z], 0.0),
        name="packedB")
    C = te.compute((M, N), lambda x, y: te.sum(A[x, k] * packedB[y // bn, k, y % bn], axis=k),
                   name="C")
    return A, B, packedB, C


def tutorial_step(step, M, N, K, bn=32, kfactor=4):
    """The schedules of TVM's "How to optimize GEMM on CPU", step by step."""
    if step in ("baseline", "blocking", "vectorization", "permutation"):
        A, B, C = gemm(M, N, K)
        s = te.create_schedule(C.op)
        if step == "baseline":
            return s, [A, B, C]
        mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], bn, bn)
        (kaxis,) = s[C].op.reduce_axis
        ko, ki = s[C].split(kaxis, factor=kfactor)
        if step == "permutation":
            s[C].reorder(mo, no, ko, mi, ki, ni)
        else:
            s[C].reorder(mo, no, ko, ki, mi, ni)
        if step != "blocking":
            s[C].vectorize(ni)
        return s, [A, B, C]
    A, B, packedB, C = packed_gemm(M, N, K, bn)
    s = te.create_schedule(C.op)
    x, y, z = s[packedB].op.axis
    s[packedB].vectorize(z)
    s[packedB].parallel(x)
    if step == "packing":
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
    elif step != "cache":
        raise ValueError(step)
    return s, [A, B, C]


TUTORIAL_STEPS = ("baseline", "blocking", "vectorization", "permutation", "packing", "cache",
                  "parallel")


def microkernel(M, N, K, mr=4, nr=64, lanes=16, pack_per_panel=False):
    """Register-blocked GEMM: an mr x nr accumulator tile over packed B, k outermost inside.

    ``pack_per_panel`` packs each K x nr panel of B inside the parallel loop that uses it.
    """
    A, B, packedB, C = packed_gemm(M, N, K, nr)
    s = te.create_schedule(C.op)
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


def batch_matmul(batch, M, N, K):
    k = te.reduce_axis((0, K), "k")
    A = te.placeholder((batch, M, K), name="A")
    B = te.placeholder((batch, K, N), name="B")
    C = te.compute((batch, M, N), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k),
                   name="C")
    return A, B, C


def broadcast_add(n, m, p):
    """C[i, j, l] = A[i, 0, l] + B[0, j, l] (numpy broadcasting of (n,1,p) + (1,m,p))."""
    A = te.placeholder((n, 1, p), name="A")
    B = te.placeholder((1, m, p), name="B")
    C = te.compute((n, m, p), lambda i, j, l: A[i, 0, l] + B[0, j, l], name="C")
    return A, B, C


def row_reduce(n, m, kind="sum"):
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), "k")
    red = {"sum": te.sum, "max": te.max, "min": te.min}[kind]
    R = te.compute((n,), lambda i: red(A[i, k], axis=k), name="R")
    return A, R


def softmax(n, m):
    A = te.placeholder((n, m), name="A")
    k1 = te.reduce_axis((0, m), "k1")
    k2 = te.reduce_axis((0, m), "k2")
    mx = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="maxelem")
    ex = te.compute((n, m), lambda i, j: te.exp(A[i, j] - mx[i]), name="exp")
    sm = te.compute((n,), lambda i: te.sum(ex[i, k2], axis=k2), name="expsum")
    out = te.compute((n, m), lambda i, j: ex[i, j] / sm[i], name="softmax")
    return A, mx, ex, sm, out


def conv2d_nchw(n, c, h, w, f, kh, kw, pad, stride):
    data = te.placeholder((n, c, h, w), name="data")
    kernel = te.placeholder((f, c, kh, kw), name="kernel")
    hp, wp = h + 2 * pad, w + 2 * pad
    padded = te.compute(
        (n, c, hp, wp),
        lambda b, ci, y, x: te.if_then_else(
            te.all(y >= pad, y < h + pad, x >= pad, x < w + pad),
            data[b, ci, y - pad, x - pad], 0.0),
        name="pad")
    oh, ow = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    rc = te.reduce_axis((0, c), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    out = te.compute(
        (n, f, oh, ow),
        lambda b, fo, y, x: te.sum(
            padded[b, rc, y * stride + ry, x * stride + rx] * kernel[fo, rc, ry, rx],
            axis=[rc, ry, rx]),
        name="conv")
    return data, kernel, padded, out
