"""Winograd's F(m x m, 3 x 3) for 3x3 convolutions: the default of the layers its plan covers
(relay.build transforms the weight once), every register tile it offers computing the
convolution with the group's tail, odd sizes, asymmetric padding and batches included; the
tuning task's reference (numpy's Winograd on the transformed weight) is numpy's convolution; the
layers it does not cover keep the direct schedules."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import kernelrpc  # noqa: E402
from kernelrpc import autotvm, nd  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.relay import strategy, tuning  # noqa: E402
from kernelrpc.relay.op import winograd  # noqa: E402
from kernelrpc.relay.op.reference import conv2d_reference  # noqa: E402
from target_families import family_params  # noqa: E402
from test_relay_conv_channels import Knobs, conv_layer, conv_model, conv_node, run  # noqa: E402

TARGET = Target(None)
RNG = np.random.default_rng(5)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("data, padding", [((2, 5, 9, 11), (1, 1, 1, 1)),
                                           ((1, 3, 8, 7), (0, 2, 1, 0)),
                                           ((1, 4, 6, 6), (0, 0, 0, 0))])
def test_the_transformed_weight_computes_the_convolution(m, data, padding):
    """numpy's Winograd with U = G g G^T is numpy's direct convolution (a tuning candidate's
    check stands for the convolution itself)."""
    x = RNG.standard_normal(data).astype("float32")
    w = RNG.standard_normal((8, data[1], 3, 3)).astype("float32")
    expect = conv2d_reference(x, w, strides=(1, 1), padding=padding, dilation=(1, 1),
                                     groups=1)
    u = winograd.transform_weight(w, m, lanes=4)
    assert u.shape == (m + 2, m + 2, 2, data[1], 4)
    got = winograd.reference(x, u, m=m, padding=padding, out_shape=expect.shape)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-5 * np.abs(expect).max())


CASES = {
    "56x56": dict(x=(1, 16, 20, 20), w=(32, 16, 3, 3), pads=(1, 1, 1, 1), residual=True),
    "odd map, asymmetric padding": dict(x=(1, 8, 13, 11), w=(16, 8, 3, 3), pads=(0, 2, 1, 1)),
    "unpadded, batch 2": dict(x=(2, 12, 10, 9), w=(32, 12, 3, 3), residual=True),
    "7x7, F(2x2)": dict(x=(1, 32, 7, 7), w=(64, 32, 3, 3), pads=(1, 1, 1, 1), residual=True),
}


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_register_tile_computes_the_convolution_in_a_network(case, target):
    mod, params, feeds, expect, conv = conv_layer(**CASES[case])
    tiles = strategy.tiles_for(target)
    if tiles.lanes == 1:
        assert strategy.winograd_plan(tiles, conv) is None
        pytest.skip("Winograd is not offered on a scalar target")
    m, rows = strategy.winograd_plan(tiles, conv)
    assert m == (2 if min(conv.shape[2:]) < 8 else 4)
    lib = relay.build(mod, target=target, params=params)
    (weight,) = [p for p in lib.get_params().values() if p.ndim == 5]
    assert weight.shape == (m + 2, m + 2, conv.shape[1] // tiles.lanes, conv.inputs[0].shape[1],
                            tiles.lanes)
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=0,
                               atol=1e-4 * np.abs(expect).max(), err_msg=f"{case}, default, {target}")
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, conv, padded=True)
    assert [e.val for e in space.space_map["layout"].entities] == ["winograd"]
    for r in space.space_map["gemm_rows"].entities:
        for v in space.space_map["gemm_vectors"].entities:
            with Knobs(gemm_rows=r.val, gemm_vectors=v.val):
                lib = relay.build(mod, target=target, params=params)
            assert lib.executor["kernels"][0]["config"]["gemm_rows"] == r.val
            np.testing.assert_allclose(run(lib, feeds), expect, rtol=0,
                                       atol=1e-4 * np.abs(expect).max(),
                                       err_msg=f"{case}, {r.val} rows x {v.val} vectors")


@pytest.mark.parametrize("data, weight, band", [
    ((1, 64, 224, 224), (64, 64, 3, 3), 4),       # a row of 56 tiles: 516 KB a stage
    ((1, 256, 112, 112), (64, 256, 3, 3), 2),     # 1 MB a row of 28 tiles
    ((1, 64, 56, 56), (64, 64, 3, 3), 14),        # 129 KB a row: the whole map
    ((2, 16, 20, 20), (32, 16, 3, 3), 5),         # the whole map of each image
])
def test_large_maps_run_band_by_band(data, weight, band):
    node = conv_node(data, weight)
    m, _ = strategy.winograd_plan(strategy.tiles_for(TARGET), node)
    assert strategy.winograd_band(m, node) == band


def test_a_banded_layer_computes_the_convolution():
    """Bands of 19 of the map's 38 tile rows, the last one's tiles past the map's edge."""
    mod, params, feeds, expect, conv = conv_layer((1, 64, 150, 38), (64, 64, 3, 3),
                                                   pads=(1, 1, 1, 1), residual=True)
    m, _ = strategy.winograd_plan(strategy.tiles_for(TARGET), conv)
    assert m == 4 and strategy.winograd_band(m, conv) < winograd.tiles(m, 150, 38)[0]
    lib = relay.build(mod, target=TARGET, params=params)
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=0, atol=1e-4 * np.abs(expect).max())


def test_avx2_tiles_fit_its_registers():
    target = Target("llvm -mcpu=haswell")
    tiles = strategy.tiles_for(target)
    mod, params, feeds, expect, conv = conv_layer(**CASES["56x56"])
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, conv, padded=True)
    assert max(e.val for e in space.space_map["gemm_rows"].entities) <= tiles.registers - 4
    lib = relay.build(mod, target=target, params=params)
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=0, atol=1e-4 * np.abs(expect).max())


@pytest.mark.parametrize("data, weight, attrs, target", [
    ((1, 16, 14, 14), (32, 16, 3, 3), dict(strides=(2, 2)), None),           # strided
    ((1, 16, 14, 14), (32, 8, 3, 3), dict(groups=2), None),                  # grouped
    ((1, 4, 14, 14), (32, 4, 3, 3), {}, None),                               # 4 input channels
    ((1, 16, 14, 14), (24, 16, 3, 3), {}, "llvm -mcpu=skylake-avx512"),      # 24 of 16 lanes
    ((1, 16, 14, 14), (32, 16, 1, 1), {}, None),                             # 1x1
    ((1, 512, 7, 7), (512, 512, 3, 3), {}, None),                            # 16.8 MB weight
    ((1, 16, 14, 14), (32, 16, 3, 3), {}, "llvm -mtriple=riscv64-linux-gnu"),  # scalar target
])
def test_layers_it_does_not_cover_keep_the_direct_schedules(data, weight, attrs, target):
    node = conv_node(data, weight, **attrs)
    tiles = strategy.tiles_for(Target(target))
    assert strategy.winograd_plan(tiles, node) is None
    space = autotvm.ConfigSpace()
    strategy.define_conv_knobs(space, tiles, node, padded=True)
    assert "gemm_rows" not in space.space_map


def test_the_tuning_task_takes_the_transformed_weight():
    """The task's weight argument is the transformed weight, as in the network (the kernel
    timed is the network's); its candidates match numpy's Winograd, and its log entry is the
    layer's in relay.build."""
    attrs = {"dilation": [1, 1], "groups": 1, "padding": [1, 1, 1, 1], "strides": [1, 1]}
    wkl = ("conv2d_nchw", [1, 16, 10, 10], [32, 16, 3, 3],
           [[k, v] for k, v in sorted(attrs.items())], "float32", str(TARGET))
    task = tuning.task_of(wkl, flop=1.0)
    lanes = strategy.tiles_for(TARGET).lanes
    assert task.arg_specs[1] == ((6, 6, 32 // lanes, 16, lanes), "float32")
    inputs = [RNG.standard_normal(shape).astype(dtype) for shape, dtype in task.arg_specs[:2]]
    expect = task.reference(*inputs)
    for config in (task.config_space.get(k) for k in range(len(task.config_space))):
        s, args = task.instantiate(config)
        lib = kernelrpc.build(s, args, target=TARGET)
        out = nd.empty(task.arg_specs[-1][0], "float32")
        lib[lib.metadata["functions"][0]["name"]](*(nd.array(a) for a in inputs), out)
        np.testing.assert_allclose(out.numpy(), expect, rtol=0, atol=1e-4 * np.abs(expect).max(),
                                   err_msg=str(config))
    model, feeds, reference = conv_model((1, 16, 10, 10), (32, 16, 3, 3), pads=(1, 1, 1, 1))
    mod, params = relay.frontend.from_onnx(model)
    (found,) = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    assert found.workload == task.workload


def test_a_winograd_task_tunes_through_a_tracker(fleet, tmp_path):
    """Every candidate of a Winograd layer's task measures ``ok`` on a real device server: its
    outputs are within the task's ``scale_atol`` of numpy's Winograd (F(4x4)'s rounding grows
    with the output's scale, past the runner's fixed tolerance), and the tuned layer builds."""
    tracker, _ = fleet
    model, feeds, expect = conv_model((1, 64, 28, 28), (64, 64, 3, 3), pads=(1, 1, 1, 1))
    mod, params = relay.frontend.from_onnx(model)
    (task,) = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    assert task.scale_atol == strategy.WINOGRAD.scale_atol
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                             number=1, repeat=1))
    log = tmp_path / "winograd.log"
    autotvm.tune_tasks([task], len(task.config_space), option, log)
    records = autotvm.load_from_file(log)
    assert records and all(r["result"]["status"] == "ok" for r in records), records
    with autotvm.apply_history_best(str(log)):
        lib = relay.build(mod, target=TARGET, params=params)
    assert lib.executor["kernels"][0]["schedule"] == "tuned"
    np.testing.assert_allclose(run(lib, feeds), expect, rtol=0, atol=1e-4 * np.abs(expect).max())
