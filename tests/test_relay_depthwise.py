"""Depthwise convolutions' schedule (one channel's rows x columns in registers, the window
unrolled): every tile its knobs offer, with the default padded input and with every other
place of it (read in place, staged per channel, staged at the root), computes the convolution
with the group's tail, on shapes whose rows and columns the tiles do not divide, strided,
dilated, unpadded and with a channel multiplier, against numpy."""
import pytest

pytest.importorskip("onnx")

import numpy as np  # noqa: E402

from kernelrpc import autotvm, relay  # noqa: E402
from kernelrpc.relay import strategy  # noqa: E402

from kernelrpc.compiler.target import Target  # noqa: E402

from target_families import family_params  # noqa: E402
from test_relay_conv_channels import Knobs, conv_layer, conv_node, run  # noqa: E402

CASES = {
    "3x3 padded": dict(x=(1, 24, 13, 19), w=(24, 1, 3, 3), pads=(1, 1, 1, 1), group=24),
    "3x3 stride 2": dict(x=(1, 16, 15, 22), w=(16, 1, 3, 3), strides=(2, 2),
                         pads=(1, 1, 1, 1), group=16),
    "5x5 dilated": dict(x=(1, 8, 12, 11), w=(8, 1, 5, 5), dilations=(2, 2),
                        pads=(4, 4, 4, 4), group=8),
    "3x3 unpadded, multiplier 2": dict(x=(2, 6, 9, 33), w=(12, 1, 3, 3), group=6),
    "3x3 rows 7 AVX2 vectors wide":
        dict(x=(1, 5, 9, 61), w=(5, 1, 3, 3), pads=(1, 1, 1, 1), group=5),
    "stride 2 asymmetric padding": dict(x=(1, 32, 14, 14), w=(32, 1, 3, 3), strides=(2, 2),
                                        pads=(0, 0, 1, 1), group=32),
}


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_depthwise_tile_computes_the_convolution(case, target):
    mod, params, feeds, expect, conv = conv_layer(**CASES[case])
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, strategy.tiles_for(target), conv,
                               padded=any(CASES[case].get("pads", ())))
    values = {name: [e.val for e in knob.entities] for name, knob in space.space_map.items()}
    configs = [dict(tile_y=y, tile_x=x) for y in values["tile_y"] for x in values["tile_x"]]
    configs += [dict(pad=p) for p in values["pad"][1:]]
    for knobs in configs:
        with Knobs(**knobs):
            lib = relay.build(mod, target=target, params=params)
        (record,) = lib.executor["kernels"]
        assert {k: record["config"][k] for k in knobs} == knobs
        np.testing.assert_allclose(run(lib, feeds), expect, rtol=1e-4,
                                   atol=1e-4 * np.abs(expect).max(), err_msg=f"{case} {knobs} {target}")


def test_depthwise_tile_fits_the_registers():
    """7 rows on 28-row maps, 4 on 56, two vectors on wide maps; fewer rows where the
    accumulators and the window's weights would not fit AVX2's 16 registers."""
    avx512, avx2 = (strategy.tiles_for(Target(t)) for t in ("llvm -mcpu=znver4",
                                                            "llvm -mcpu=haswell"))
    assert strategy.depthwise_tile(avx512, conv_node((1, 8, 30, 30), (8, 1, 3, 3), 8)) == (7, 16)
    assert strategy.depthwise_tile(avx512, conv_node((1, 8, 58, 58), (8, 1, 3, 3), 8)) == (4, 16)
    assert strategy.depthwise_tile(avx512, conv_node((1, 8, 114, 114), (8, 1, 3, 3), 8)) == \
        (4, 32)
    assert strategy.depthwise_tile(avx2, conv_node((1, 8, 30, 30), (8, 1, 3, 3), 8)) == (5, 8)
    assert strategy.depthwise_tile(avx2, conv_node((1, 8, 32, 32), (8, 1, 5, 5), 8)) == (1, 8)


def test_default_pad_place_follows_the_target():
    """In place (the padded reads' selects left to the edge tiles by loop partitioning), but
    a strided layer from 28 pixels or fewer stages its channel's phases on targets of 4 and 8
    lanes; AVX-512 reads in place everywhere."""
    avx512, avx2, sse = (strategy.tiles_for(Target(t)) for t in (
        "llvm -mcpu=znver4", "llvm -mcpu=haswell", "llvm -mcpu=x86-64"))

    def layer(size, stride):
        return conv_node((1, 8, size, size), (8, 1, 3, 3), 8, (stride, stride))
    for tiles in (avx2, sse):
        assert strategy.depthwise_pad(tiles, layer(28, 2)) == "channel"
        assert strategy.depthwise_pad(tiles, layer(14, 2)) == "channel"
        assert strategy.depthwise_pad(tiles, layer(56, 2)) == "inline"
        assert strategy.depthwise_pad(tiles, layer(112, 1)) == "inline"
        assert strategy.depthwise_pad(tiles, layer(14, 1)) == "inline"
    assert strategy.depthwise_pad(avx512, layer(14, 2)) == "inline"
