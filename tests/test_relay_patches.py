"""A convolution whose windows tile its input (a ViT's or Swin's patch embedding) runs as a
matrix product of its patches (``relay.transform.patches_as_rows``); others stay
convolutions. Outputs against onnxruntime."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402
from onnx_check import graph_model  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402
from kernelrpc.relay.transform import optimize  # noqa: E402

RNG = np.random.default_rng(5)


def conv_model(x_shape, out_channels, kernel, strides, pads=(0, 0, 0, 0), bias=True):
    inits = {"w": RNG.standard_normal((out_channels, x_shape[1], *kernel)).astype("float32")
             * 0.05}
    if bias:
        inits["b"] = RNG.standard_normal(out_channels).astype("float32")
    node = helper.make_node("Conv", ["x", *inits], ["y"], kernel_shape=list(kernel),
                            strides=list(strides), pads=list(pads))
    return graph_model([node], {"x": (x_shape, "float32")}, ["y"], inits)


CASES = {
    "vit 16x16/16": (conv_model((1, 3, 64, 48), 32, (16, 16), (16, 16)), True),
    "8x8/8 of 4 channels, two images": (
        conv_model((2, 4, 16, 24), 24, (8, 8), (8, 8), bias=False), True),
    "4x4/4 of 16 channels": (conv_model((1, 16, 16, 20), 24, (4, 4), (4, 4)), False),
    "padded": (conv_model((1, 3, 64, 64), 32, (16, 16), (16, 16), pads=(1, 1, 1, 1)), False),
    "overlapping": (conv_model((1, 3, 64, 64), 32, (16, 16), (8, 8)), False),
    "a map of no whole patches": (conv_model((1, 3, 70, 64), 32, (16, 16), (16, 16)), False),
    "a short reduction": (conv_model((1, 2, 64, 64), 32, (8, 8), (8, 8)), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_patch_convolution_is_a_matrix_product(name):
    model, as_rows = CASES[name]
    mod, params = relay.frontend.from_onnx(model)
    ops = {node.op for node in optimize(mod["main"], params).topo()}
    assert ("nn.dense" in ops and "nn.conv2d" not in ops) == as_rows, ops
    x_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = RNG.standard_normal(x_shape).astype("float32")
    lib = relay.build(mod, target="llvm", params=params)
    g = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    g.set_input(x=x)
    g.run()
    (expect,) = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_allclose(g.get_output(0).numpy(), expect, rtol=1e-4, atol=1e-4)
