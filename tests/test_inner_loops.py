"""The main kernels' inner loops are vector multiply-add loops on the 4-lane boards (aarch64,
armv7 NEON) as on x86, read from their assembly (kernelrpc.compiler.inner_loop): under
emulation a board's timings mean nothing, its instructions do."""
import pytest

pytest.importorskip("onnx")

import kernelrpc  # noqa: E402
from kernelrpc import relay  # noqa: E402
from kernelrpc.compiler import recipes  # noqa: E402
from kernelrpc.compiler.inner_loop import hottest_loop, inner_loops  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from test_relay_conv_channels import conv_model  # noqa: E402

BOARDS = {"aarch64": "llvm -mtriple=aarch64-linux-gnu",
          "armv7-neon": "llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp4",
          "avx2": "llvm -mcpu=haswell"}


@pytest.mark.parametrize("board, mr, nr, fmas", [("avx2", 6, 16, 12), ("aarch64", 8, 12, 24),
                                                 ("armv7-neon", 4, 8, 8)])
def test_the_gemm_recipe_s_inner_loop_is_its_register_tile(board, mr, nr, fmas):
    """One vector multiply-add per accumulator a step, the target's tile (recipes.gemm_tile)."""
    target = Target(BOARDS[board])
    assert recipes.gemm_tile(target)[:2] == (mr, nr)
    s, args = recipes.register_blocked(96, 96, 96, target=target)
    mix = hottest_loop(kernelrpc.build(s, args, target=target).get_source("asm"), target.arch)
    assert mix.vector_fmas == fmas and mix.stores == 0
    assert mix.fmas_per_load >= 1.3


def _matmul(a_shape, b_shape):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones(b_shape, "float32"), "b")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


LAYERS = {
    "conv 1x1": lambda: conv_model(x=(1, 64, 14, 14), w=(64, 64, 1, 1))[0],
    "conv 3x3 strided": lambda: conv_model(x=(1, 16, 28, 28), w=(32, 16, 3, 3), strides=(2, 2),
                                           pads=(1, 1, 1, 1))[0],
    "depthwise": lambda: conv_model(x=(1, 32, 28, 28), w=(32, 1, 3, 3), pads=(1, 1, 1, 1),
                                    group=32)[0],
    "dense rows": lambda: _matmul((37, 64), (64, 96)),
    "dense one row": lambda: _matmul((1, 256), (256, 512)),
}


@pytest.mark.parametrize("board", ["aarch64", "armv7-neon"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_s_inner_loop_is_a_vector_multiply_add_loop(layer, board):
    target = Target(BOARDS[board])
    mod, params = relay.frontend.from_onnx(LAYERS[layer]())
    lib = relay.build(mod, target=target, params=params)
    mix = hottest_loop(lib.get_source("asm"), target.arch)
    assert mix is not None, f"{layer} on {board}: no vector multiply-add loop"
    assert mix.vector_fmas >= 4 and mix.fma_share >= 0.2, mix


def test_loops_are_innermost_and_counted_from_their_label():
    assembly = "\n".join([
        "f:", "  mov x0, #0", ".LBB0_1:", "  ldr q0, [x1], #16", ".LBB0_2:",
        "  fmla v1.4s, v0.4s, v2.4s", "  fmla v3.4s, v0.4s, v2.4s  // two",
        "  subs x2, x2, #1", "  b.ne .LBB0_2", "  str q1, [x3]", "  cbnz x4, .LBB0_1", "  ret"])
    (loop,) = inner_loops(assembly, "aarch64")
    assert (loop.label, loop.instructions, loop.vector_fmas, loop.loads, loop.stores) == \
        (".LBB0_2", 4, 2, 0, 0)
