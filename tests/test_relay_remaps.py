"""Kernels that only move elements (Reshape, Transpose, Slice): their output's last axis in
vectors where the remap keeps the innermost axis (attention's heads, the patches of a ViT's
stem as rows), a loop where it moves it; outputs exactly onnxruntime's."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402
from onnx_check import graph_model  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay.strategy import tiles_for  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from target_families import family_params  # noqa: E402


def _shape(name, values):
    return {name: np.array(values, np.int64)}


#: (nodes, input shape, initializers, the innermost run the remap keeps: a vector of the
#: target's lanes reads consecutive elements where the lanes divide it)
HEADS = ([helper.make_node("Reshape", ["x", "s"], ["r"]),
          helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])],
         (1, 197, 256), _shape("s", [1, 197, 4, 64]), 64)
PATCHES = ([helper.make_node("Reshape", ["x", "s"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 4, 1, 3, 5]),
            helper.make_node("Reshape", ["t", "s2"], ["y"])],
           (1, 3, 64, 64), {**_shape("s", [1, 3, 4, 16, 4, 16]), **_shape("s2", [16, 768])}, 16)
#: 12-wide rows: a vector of 8 or 16 lanes crosses a row, and its lanes would gather
RAGGED_PATCHES = ([helper.make_node("Reshape", ["x", "s"], ["r"]),
                   helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
                   helper.make_node("Reshape", ["t", "s2"], ["y"])],
                  (1, 4, 5, 12), {**_shape("s", [1, 4, 5, 12]), **_shape("s2", [5, 48])}, 12)
SWAPPED = ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], (1, 64, 48), {}, 1)


@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("case", [HEADS, PATCHES, RAGGED_PATCHES, SWAPPED],
                         ids=["heads", "patches", "ragged patches", "swapped axes"])
def test_a_remap_runs_in_vectors_where_it_keeps_the_innermost_axis(case, target):
    nodes, x_shape, inits, run = case
    lanes = tiles_for(target).lanes
    model = graph_model(nodes, {"x": (x_shape, "float32")}, ["y"], inits)
    x = np.random.default_rng(3).standard_normal(x_shape).astype("float32")
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=target, params=params)
    (kernel,) = lib.executor["kernels"]
    lowered = lib.lib.get_source("lowered")
    main_loop = lowered.split("parallel", 1)[1]
    assert ("ramp(" in main_loop) == (run % lanes == 0), lowered
    g = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    g.set_input(x=x)
    g.run()
    (expect,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(g.get_output(0).numpy(), expect)
