"""The conv2d recipes (NCHW and blocked NCHWc) compute what numpy does, odd sizes included,
with the tiles of every x86 vector width this host runs."""
from __future__ import annotations

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd
from kernelrpc.compiler import recipes
from target_families import family_params


def _reference(data, kernel):
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded[0], (3, 3), axis=(1, 2))
    return np.einsum("cyxij,fcij->fyx", windows, kernel)[None]


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_conv2d_recipes(layout, target):
    c, f, h, w = 32, 32, 9, 13
    rng = np.random.default_rng(4)
    data = rng.random((1, c, h, w), dtype=np.float32)
    kernel = rng.random((f, c, 3, 3), dtype=np.float32)
    dev = kernelrpc.cpu(0)
    if layout == "nchw":
        s, args = recipes.conv2d_nchw(1, c, h, w, f, target=target)
        d, k = data, kernel
    else:
        s, args = recipes.conv2d_nchwc(1, c, h, w, f, target=target)
        cb, fb = (int(args[i].shape[-1].value) for i in (0, 1))
        assert (cb, fb) == recipes.nchwc_tile(target)[:2]
        d = data.reshape(1, c // cb, cb, h, w).transpose(0, 1, 3, 4, 2).copy()
        k = kernel.reshape(f // fb, fb, c // cb, cb, 3, 3).transpose(0, 2, 4, 5, 3, 1).copy()
    module = kernelrpc.build(s, args, target=target, name="conv")
    out = nd.empty(tuple(int(x.value) for x in args[2].shape), "float32", dev)
    module(nd.array(d, dev), nd.array(k, dev), out)
    got = out.numpy()
    if layout == "nchwc":
        got = got.transpose(0, 1, 4, 2, 3).reshape(1, f, h, w)
    np.testing.assert_allclose(got, _reference(data, kernel), rtol=1e-4, atol=1e-4)


def test_nchwc_refuses_channels_its_blocks_do_not_divide():
    with pytest.raises(ValueError, match="24 input and 32 output channels must be multiples"):
        recipes.conv2d_nchwc(1, 24, 5, 5, 32, cb=16, fb=16)
