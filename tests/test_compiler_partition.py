"""Loop partitioning of padded reads: the selects stay in the tiles at the map's edges."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp, ir
from kernelrpc.compiler.expr import Select

import te_workloads as W


def _conv(channels, size, pad, stride, tile_y, tile_x):
    """A 3x3 depthwise-like window over an inlined padding stage, in register tiles."""
    data, kernel, padded, out = W.conv2d_nchw(1, channels, size, size, 2, 3, 3, pad, stride)
    s = te.create_schedule(out.op)
    s[padded].compute_inline()
    _, _, y, x = s[out].op.axis
    yo, xo, yi, xi = s[out].tile(y, x, tile_y, tile_x)
    s[out].vectorize(xi)
    return s, [data, kernel, out]


def _lowered(s, args, partitioned: bool):
    with te.PassContext(opt_level=2 if partitioned else 1):
        return te.lower(s, args)


def _loops(func):
    loops = []
    ir.post_order_visit(func.body, lambda n: loops.append(n) if isinstance(n, ir.For) else None)
    return loops


def _has_select(node) -> bool:
    found = []
    ir.post_order_visit(node, lambda n: found.append(n) if isinstance(n, Select) else None)
    return bool(found)


def _reference(a, w, pad, stride):
    padded = np.pad(a, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    size = (padded.shape[2] - 3) // stride + 1
    out = np.zeros((1, w.shape[0], size, size), "float32")
    for ky in range(3):
        for kx in range(3):
            window = padded[:, :, ky:ky + stride * size:stride, kx:kx + stride * size:stride]
            out += np.einsum("nchw,fc->nfhw", window, w[:, :, ky, kx])
    return out


def _run(func, a, w, out_shape):
    out = np.zeros(out_shape, "float32")
    interp.run(func, a, w, out)
    return out


def test_the_tiles_inside_the_map_read_without_selects():
    s, args = _conv(channels=3, size=16, pad=1, stride=2, tile_y=2, tile_x=4)
    plain, partitioned = _lowered(s, args, False), _lowered(s, args, True)
    assert all(_has_select(loop) for loop in _loops(plain))
    # the rows' and columns' first tiles keep the selects (the padding is before them);
    # the 3 x 1 tiles after them are one loop nest without a select
    clean = [loop for loop in _loops(partitioned)
             if loop.kind == "serial" and not _has_select(loop) and loop.extent.value == 3]
    assert clean, "no clean loop of the 3 tiles after the first"
    assert str(partitioned).count("select") > 0        # the edges keep theirs
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 3, 16, 16), dtype=np.float32)
    w = rng.standard_normal((2, 3, 3, 3), dtype=np.float32)
    expect = _reference(a, w, 1, 2)
    for func in (plain, partitioned):
        np.testing.assert_allclose(_run(func, a, w, expect.shape), expect, rtol=1e-5, atol=1e-5)
    module = kernelrpc.build(s, args, name="padded_window")
    dev = kernelrpc.cpu(0)
    out = nd.empty(expect.shape, "float32", dev)
    module(nd.array(a, dev), nd.array(w, dev), out)
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-5, atol=1e-5)


def test_a_guard_clean_on_less_than_half_the_loop_is_not_partitioned():
    """A lower-triangle mask (``j <= i``) holds on all of an inner loop only for the last
    row: splitting there would copy the body for one iteration."""
    n = 8
    a = te.placeholder((n, n), name="a")
    masked = te.compute((n, n), lambda i, j: te.if_then_else(j <= i, a[i, j], 0.0),
                        name="masked")
    s = te.create_schedule(masked.op)
    func = _lowered(s, [a, masked], True)
    assert len([loop for loop in _loops(func) if loop.var.name == "i"]) == 1


@settings(max_examples=25, deadline=None)
@given(size=st.integers(5, 19), pad=st.integers(0, 2), stride=st.integers(1, 3),
       tile_y=st.integers(1, 4), tile_x=st.sampled_from([1, 2, 4, 8]))
def test_partitioned_padded_windows_compute_what_the_unpartitioned_do(size, pad, stride,
                                                                      tile_y, tile_x):
    if size + 2 * pad < 3:
        return
    s, args = _conv(2, size, pad, stride, tile_y, tile_x)
    rng = np.random.default_rng(size * 100 + pad * 10 + stride)
    a = rng.standard_normal((1, 2, size, size), dtype=np.float32)
    w = rng.standard_normal((2, 2, 3, 3), dtype=np.float32)
    expect = _reference(a, w, pad, stride)
    for partitioned in (False, True):
        got = _run(_lowered(s, args, partitioned), a, w, expect.shape)
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)
