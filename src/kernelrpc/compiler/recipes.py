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


def gemm_tile(target=None) -> tuple[int, int, int]:
    """``(mr, nr, lanes)`` of :func:`register_blocked` for ``target`` (default: this host),
    from its vector unit: ``mr`` rows x ``nr / lanes`` vectors of accumulators, with room left
    for the row of B and the broadcast of A. AVX-512 4 x 64 (16 of 32 zmm), AVX2 6 x 16 (12
    of 16 ymm), SSE 6 x 8, aarch64 8 x 12 (24 of 32 q registers), armv7 NEON 4 x 8, scalar
    4 x 4."""
    from .target import Target
    from .vector_isa import vector_isa

    isa = vector_isa(Target(target))
    if isa.lanes == 1:
        return 4, 4, 1
    if isa.lanes == 16:
        return 4, 64, 16
    if isa.registers >= 32:
        return 8, 3 * isa.lanes, isa.lanes
    if isa.lanes == 8 or isa.name == "sse":
        return 6, 2 * isa.lanes, isa.lanes
    return 4, 2 * isa.lanes, isa.lanes


#: bytes of A a row block may hold: rows of A that every panel of packed B passes while they
#: stay in one core's L2 (1 MiB: half of a 2 MiB L2, a 1 MiB L2 whole; a smaller L2 is no
#: worse off than without row blocks, where A comes from L3 for every panel)
ROW_BLOCK_BYTES = 1 << 20


def row_block(K, mr) -> int:
    """Rows of A in one row block of :func:`register_blocked`: whole tiles of ``mr`` rows whose
    ``K`` float32 columns fit ``ROW_BLOCK_BYTES``, at least one tile."""
    return mr * max(1, ROW_BLOCK_BYTES // (4 * K * mr))


def register_blocked(M, N, K, mr=None, nr=None, lanes=None, pack_per_panel=False, target=None,
                     mc=None):
    """Register-blocked GEMM: an ``mr x nr`` tile of C in vector registers for the whole K loop.

    A block of ``mc`` rows of A (default :func:`row_block`: what stays in L2) meets every
    ``nr``-wide panel of packed B before the next block starts, so A is read from memory
    once, not once a panel; threads split the panels (each panel stays in one core's L2).
    Inside a panel, the ``mr`` rows and ``nr / lanes`` vectors of the accumulator tile are
    unrolled, so every access to it has a constant offset and LLVM keeps it in registers.
    ``pack_per_panel`` packs each panel inside the parallel loop that uses it instead of in a
    pass of its own (and then the rows are one block: a panel is packed once).
    The tile not given is the target's (:func:`gemm_tile`; ``target`` default: this host).
    """
    default_mr, default_nr, default_lanes = gemm_tile(target)
    mr, nr, lanes = mr or default_mr, nr or default_nr, lanes or default_lanes
    mc = M if pack_per_panel else mc or row_block(K, mr)
    A, B, packedB, C = packed_matmul(M, N, K, nr)
    s = create_schedule(C.op)
    CC = s.cache_write(C, "global")
    mo, no, mi, ni = s[C].tile(C.op.axis[0], C.op.axis[1], mr, nr)
    if mc < M:
        blocks, mo = s[C].split(mo, factor=max(1, mc // mr))
        s[C].reorder(blocks, no, mo, mi, ni)
    else:
        s[C].reorder(no, mo, mi, ni)
    s[CC].compute_at(s[C], mo)
    register_tile(s[CC], lanes)
    s[C].vectorize(ni)
    s[C].parallel(no)
    x, _, z = s[packedB].op.axis
    s[packedB].vectorize(z)
    if pack_per_panel:
        s[packedB].compute_at(s[C], no)
    else:
        s[packedB].parallel(x)
    return s, [A, B, C]


def register_tile(stage, lanes: int) -> None:
    """An accumulator tile (its last two axes rows x columns) kept in registers over its one
    reduction: the reduction outside, the rows and the vectors of columns unrolled (every
    access at a constant offset), each vector ``lanes`` wide (a last tile's tail a shorter
    vector, not a wider one)."""
    *_, rows, columns = stage.op.axis
    (k,) = stage.op.reduce_axis
    vectors, lane = stage.split(columns, factor=lanes)
    stage.reorder(k, rows, vectors, lane)
    stage.unroll(rows)
    stage.unroll(vectors)
    stage.vectorize(lane)


def _padded(data, pad, name="pad"):
    """Zero padding of the two spatial dimensions that follow the channel dimension(s)."""
    shape = [d.value for d in data.shape]
    h, w = shape[2], shape[3]
    out_shape = list(shape)
    out_shape[2], out_shape[3] = h + 2 * pad, w + 2 * pad

    def body(*idx):
        y, x = idx[2], idx[3]
        inside = (y >= pad) & (y < h + pad) & (x >= pad) & (x < w + pad)
        src = list(idx)
        src[2], src[3] = y - pad, x - pad
        return if_then_else(inside, data[tuple(src)], 0.0)
    return _t.compute(tuple(out_shape), body, name=name)


def conv2d_register_tile(s, conv, out, accumulator, tile_f, tile_x,
                         reduce_order="channels_outer", unroll_kw=False, rows_outer=False):
    """The direct NCHW convolution's schedule: ``tile_f`` output channels x ``tile_x`` output
    columns (whole vectors) of ``accumulator`` (the stage that sums ``conv``'s reduction) stay
    in registers over the whole reduction, computed inside the output stage ``out``'s tile, so
    the output's tail (bias, activation) runs on the tile in registers; channel blocks and
    rows in parallel (rows outside with ``rows_outer``: each core's share is a band of rows of
    every channel). ``reduce_order``: input channels outside the kernel window
    (``"channels_outer"``) or inside it; ``unroll_kw`` unrolls the kernel row's columns.
    Relay's direct convolutions use it (``relay.strategy.direct``)."""
    stage = s[out]
    n, f, y, x = stage.op.axis
    fo, fi = stage.split(f, factor=tile_f)
    xo, xi = stage.split(x, factor=tile_x)
    outer = (y, fo) if rows_outer else (fo, y)
    stage.reorder(n, *outer, xo, fi, xi)
    stage.vectorize(xi)
    stage.parallel(stage.fuse(stage.fuse(n, outer[0]), outer[1]))
    s[accumulator].compute_at(stage, xo)
    _, cf, _, cx = s[accumulator].op.axis
    rc, ry, rx = s[accumulator].op.reduce_axis
    if reduce_order == "channels_outer":
        s[accumulator].reorder(rc, ry, rx, cf, cx)
    else:
        s[accumulator].reorder(ry, rx, rc, cf, cx)
    if unroll_kw:
        s[accumulator].unroll(rx)
    s[accumulator].unroll(cf)
    s[accumulator].vectorize(cx)


def conv_tile(target=None) -> tuple[int, int]:
    """``(fr, xr)`` of :func:`conv2d_nchw` for ``target`` (default: this host): the tile of
    relay's direct convolutions (:mod:`kernelrpc.compiler.tiles`), ``fr`` output channels x ``xr``
    output columns (whole vectors): AVX-512 16 x 16 (16 of 32 zmm), AVX2 and SSE 6 x 2
    vectors, aarch64 12 x 2, armv7 NEON 4 x 2, scalar 4 x 4."""
    from .target import Target
    from .tiles import tiles_for

    tiles = tiles_for(Target(target))
    return tiles.conv_channels, tiles.conv_columns


def conv2d_nchw(n, c, h, w, f, kh=3, kw=3, pad=1, fr=None, xr=None, target=None):
    """Direct 3x3-style convolution in NCHW, stride 1: ``fr`` output channels x ``xr`` output
    columns (whole vectors) of accumulators stay in registers over the whole reduction
    (:func:`conv2d_register_tile`); the padded input is a stage of its own. The tile not
    given is the target's (:func:`conv_tile`). Returns ``(s, [data, kernel, out])``."""
    default_fr, default_xr = conv_tile(target)
    fr, xr = fr or default_fr, xr or default_xr
    data = _t.placeholder((n, c, h, w), name="data")
    kernel = _t.placeholder((f, c, kh, kw), name="kernel")
    padded = _padded(data, pad)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    rc = _t.reduce_axis((0, c), "rc")
    ry = _t.reduce_axis((0, kh), "ry")
    rx = _t.reduce_axis((0, kw), "rx")
    out = _t.compute((n, f, oh, ow), lambda b, fo, y, x: _t.sum(
        padded[b, rc, y + ry, x + rx] * kernel[fo, rc, ry, rx], axis=[rc, ry, rx]), name="conv")
    s = create_schedule(out.op)
    conv2d_register_tile(s, out, out, s.cache_write(out, "global"), fr, xr)
    _, cb, _, xx = s[padded].op.axis
    s[padded].parallel(cb)
    s[padded].vectorize(xx)
    return s, [data, kernel, out]


def nchwc_tile(target=None) -> tuple[int, int, int]:
    """``(cb, fb, xr)`` of :func:`conv2d_nchwc` for ``target`` (default: this host): channel
    blocks of one vector (``lanes``) and ``xr`` output columns of one vector each, four
    registers short of all and at most 12 where multiply-adds fuse on a 64-bit target (x86-64
    with FMA, aarch64), at most 6 elsewhere (SSE code, whose multiplies and adds are separate,
    spills from 10 columns on, armv7 NEON code from 8): AVX-512 16, 16, 12; AVX2 8, 8, 12;
    aarch64 4, 4, 12; SSE and armv7 NEON 4, 4, 6; x87 scalar code (8 registers) 1, 1, 4."""
    from .target import Target
    from .vector_isa import vector_isa

    target = Target(target)
    isa = vector_isa(target)
    most = 12 if isa.fma and target.arch in ("x86_64", "aarch64") else 6
    return isa.lanes, isa.lanes, max(1, min(most, isa.registers - 4))


def conv2d_nchwc(n, c, h, w, f, kh=3, kw=3, pad=1, cb=None, fb=None, xr=None, target=None):
    """Convolution in the blocked NCHW[x]c layout (TVM's conv2d_NCHWc): data
    ``[n, c/cb, h, w, cb]``, kernel ``[f/fb, c/cb, kh, kw, cb, fb]``, out ``[n, f/fb, oh, ow, fb]``.
    ``xr`` output columns x one ``fb``-wide vector of output channels are the register tile:
    each step loads one kernel vector and broadcasts ``xr`` inputs into ``xr`` FMAs.
    The blocks and the tile not given are the target's (:func:`nchwc_tile`): read ``cb`` and
    ``fb`` back from the shapes of the returned data (last axis) and kernel (last axis).
    ``c`` and ``f`` must be multiples of their blocks. Returns ``(s, [data, kernel, out])``."""
    default_cb, default_fb, default_xr = nchwc_tile(target)
    cb, fb, xr = cb or default_cb, fb or default_fb, xr or default_xr
    if c % cb or f % fb:
        raise ValueError(f"conv2d_nchwc: {c} input and {f} output channels must be multiples "
                         f"of their blocks ({cb} and {fb})")
    data = _t.placeholder((n, c // cb, h, w, cb), name="data")
    kernel = _t.placeholder((f // fb, c // cb, kh, kw, cb, fb), name="kernel")
    padded = _padded(data, pad)
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    rco = _t.reduce_axis((0, c // cb), "rco")
    ry = _t.reduce_axis((0, kh), "ry")
    rx = _t.reduce_axis((0, kw), "rx")
    rci = _t.reduce_axis((0, cb), "rci")
    out = _t.compute((n, f // fb, oh, ow, fb), lambda b, fo, y, x, fi: _t.sum(
        padded[b, rco, y + ry, x + rx, rci] * kernel[fo, rco, ry, rx, rci, fi],
        axis=[rco, ry, rx, rci]), name="conv")
    s = create_schedule(out.op)
    cc = s.cache_write(out, "global")
    b, fo, y, x, fi = s[out].op.axis
    xo, xi = s[out].split(x, factor=xr)
    s[out].reorder(b, fo, y, xo, xi, fi)
    s[out].vectorize(fi)
    s[out].parallel(s[out].fuse(fo, y))
    s[cc].compute_at(s[out], xo)
    _, _, _, cx, cf = s[cc].op.axis
    rco_, ry_, rx_, rci_ = s[cc].op.reduce_axis
    s[cc].reorder(rco_, ry_, rx_, rci_, cx, cf)
    s[cc].unroll(cx)
    s[cc].vectorize(cf)
    _, pcb, _, _, pci = s[padded].op.axis
    s[padded].parallel(pcb)
    s[padded].vectorize(pci)
    return s, [data, kernel, out]
