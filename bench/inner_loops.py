"""The instruction mix of each layer class's inner loop, from the assembly of its default
schedule, for x86 (AVX-512, AVX2, SSE), aarch64 and 32-bit Arm NEON: what a board's code does
per step where its timings under emulation mean nothing.

    python bench/inner_loops.py [--targets "llvm -mcpu=skylake-avx512;llvm -mtriple=..."]

For each layer (a one-layer network built with ``relay.build``, the group's tail included)
and target: the hottest inner loop's instructions, vector multiply-adds, memory reads, the
multiply-adds' share of the instructions and multiply-adds per read
(``kernelrpc.compiler.inner_loop``). Nothing runs; everything is compiled here.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TARGETS = ("llvm -mcpu=skylake-avx512;llvm -mcpu=haswell;llvm -mcpu=x86-64;"
           "llvm -mtriple=aarch64-linux-gnu;"
           "llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp4")


def layers():
    """``(name, onnx model)`` of the layer classes (seeded weights, odd shapes)."""
    from test_relay_conv_channels import conv_model

    from kernelrpc.relay import testing
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    def matmul(a_shape, b_shape, constant):
        rng = np.random.default_rng(0)
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
        inits = []
        if constant:
            inits.append(numpy_helper.from_array(rng.standard_normal(b_shape).astype("float32"),
                                                 "b"))
        else:
            inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape))
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g", inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    yield "conv 3x3 64->64 56x56", conv_model(x=(1, 64, 56, 56), w=(64, 64, 3, 3),
                                                pads=(1, 1, 1, 1))[0]
    yield "conv 1x1 256->64 14x14", conv_model(x=(1, 256, 14, 14), w=(64, 256, 1, 1))[0]
    yield "conv 1x1 512->1000 13x13", conv_model(x=(1, 512, 13, 13), w=(1000, 512, 1, 1))[0]
    yield "conv 3x3 stride 2", conv_model(x=(1, 64, 56, 56), w=(128, 64, 3, 3), strides=(2, 2),
                                            pads=(1, 1, 1, 1))[0]
    yield "depthwise 3x3 144 56x56", conv_model(x=(1, 144, 56, 56), w=(144, 1, 3, 3),
                                                  pads=(1, 1, 1, 1), group=144)[0]
    yield "dense 1x512 -> 1000", matmul((1, 512), (512, 1000), True)
    yield "dense 197x256 -> 1024", matmul((197, 256), (256, 1024), True)
    yield "batch matmul 4x197x64x197", matmul((4, 197, 64), (4, 64, 197), False)
    del testing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=TARGETS, help="semicolon-separated target strings")
    opts = parser.parse_args()
    from kernelrpc import relay
    from kernelrpc.compiler.inner_loop import hottest_loop
    from kernelrpc.compiler.target import Target
    from kernelrpc.compiler.vector_isa import vector_isa

    targets = [Target(t) for t in opts.targets.split(";")]
    print(f"{'layer':<28} {'target':<22} {'insns':>5} {'vFMA':>4} {'reads':>5} "
          f"{'FMA share':>9} {'FMA/read':>8}")
    for name, model in layers():
        mod, params = relay.frontend.from_onnx(model)
        for target in targets:
            lib = relay.build(mod, target=target, params=params)
            mix = hottest_loop(lib.get_source("asm"), target.arch)
            label = f"{vector_isa(target).name} {target.arch}"
            if mix is None:
                print(f"{name:<28} {label:<22} no vector multiply-add loop")
                continue
            print(f"{name:<28} {label:<22} {mix.instructions:>5} {mix.vector_fmas:>4} "
                  f"{mix.loads:>5} {mix.fma_share:>9.2f} {mix.fmas_per_load:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
