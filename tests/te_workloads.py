"""Tensor-expression workloads and schedules shared by the compiler tests."""
from __future__ import annotations

from kernelrpc import te
from kernelrpc.compiler import recipes


gemm = recipes.matmul
packed_gemm = recipes.packed_matmul
tutorial_step = recipes.tutorial_schedule
TUTORIAL_STEPS = recipes.TUTORIAL_STEPS
microkernel = recipes.register_blocked


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


def chain(n=8):
    """A -> T = A + 1 -> C = T * 2, the smallest pipeline a compute_at can attach in."""
    A = te.placeholder((n,), name="A")
    T = te.compute((n,), lambda i: A[i] + 1.0, name="T")
    C = te.compute((n,), lambda i: T[i] * 2.0, name="C")
    return A, T, C


def conv2d_reference(d, w, stride, pad):
    """numpy NCHW convolution (float64), the reference of the conv2d workloads."""
    from kernelrpc.relay.op.reference import conv2d_reference as reference

    return reference(d.astype("float64"), w.astype("float64"), strides=(stride, stride),
                     padding=(pad,) * 4, dilation=(1, 1), groups=1)


def softmax_reference(x):
    """numpy softmax over the last axis, the reference of ``softmax``."""
    import numpy as np

    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
