"""The instruction mix of each layer class's inner loop, from the assembly of its default
schedule, for x86 (AVX-512, AVX2, SSE), aarch64 and 32-bit Arm NEON: what a board's code does
per step where its timings under emulation mean nothing.

    python bench/inner_loops.py [--targets "llvm -mcpu=skylake-avx512;llvm -mtriple=..."]
    python bench/inner_loops.py --int8 [--targets ...]      # 32-bit Arm NEON by default

For each layer (a one-layer network built with ``relay.build``, the group's tail included)
and target: the hottest inner loop's instructions, vector multiply-adds, memory reads, the
multiply-adds' share of the instructions and multiply-adds per read
(``kernelrpc.compiler.inner_loop``). Nothing runs; everything is compiled here.

``--int8``: ResNet-18's layers as packed int8 convolutions (uint8 input, weights in
[-127, 127], the layer's record) and with a weight of -128 (which the smull and vmlal records
refuse: the plain vectors), against float32: instructions of the hottest loop per
multiply-add it does (its int8 products, counted on 32-bit Arm, or its float multiply-adds
times the lanes; ``winograd`` where float32 runs Winograd, whose loop is not comparable).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

INT8_TARGETS = ("llvm -mtriple=armv7-linux-gnueabihf -mcpu=cortex-a7 -mattr=+neon,+vfp4;"
                "llvm -mtriple=armv7a-linux-gnueabihf -mattr=+neon,+vfp4")
#: int8 products of one instruction of 32-bit Arm NEON's integer multiplies (q registers)
ARM_PRODUCTS = {"vmull.s8": 8, "vmlal.s8": 8, "vmull.s16": 4, "vmlal.s16": 4, "vmla.i32": 4,
                "vmul.i32": 4, "vmla.i16": 8, "vmul.i16": 8}
#: a float32 multiply (or multiply-add) of a q register: Cortex-A7 code multiplies and adds
FLOAT_MULTIPLY = re.compile(r"^v(fma|mla|mul)\.f32$")
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


#: ResNet-18's layers: input, weight, strides, padding
INT8_LAYERS = {"3x3 64->64, 56x56": ((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1)),
               "3x3 256->256, 14x14": ((1, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1, 1, 1)),
               "3x3 512->512, 7x7": ((1, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1, 1, 1)),
               "3x3/2 64->128, 56x56": ((1, 64, 56, 56), (128, 64, 3, 3), (2, 2), (1, 1, 1, 1)),
               "1x1/2 128->256, 28x28": ((1, 128, 28, 28), (256, 128, 1, 1), (2, 2), (0, 0, 0, 0))}


def int8_conv(x, w, strides, pads, lowest):
    """A packed int8 convolution (uint8 input, seeded weights in [``lowest``, 127])."""
    import numpy as np

    from kernelrpc.relay import ir
    from kernelrpc.relay.op import get, quant

    rng = np.random.default_rng(0)
    weight = rng.integers(lowest, 128, w).astype(np.int8)
    weight.flat[0] = lowest
    data = ir.Node("input", (), {}, x, "uint8", "x")
    attrs = dict(strides=strides, dilation=(1, 1), padding=pads, groups=1, out_zero=7,
                 out_min=0, out_max=255, out_dtype="uint8", kernel_layout=quant.PACKED)
    bias = rng.integers(-3000, 3000, w[0]).astype(np.int32)
    inputs = (data, ir.const(quant.pack_weight(weight)), ir.const(np.asarray(0, np.int32)),
              ir.const(quant.packed_bias(bias, weight, "uint8", 0)),
              ir.const(np.full(w[0], 1e-3, np.float32)))
    shape, dtype = get("qnn.conv2d").infer(list(inputs), attrs)
    return ir.IRModule(ir.Function([data], [ir.Node("qnn.conv2d", inputs, attrs, tuple(shape),
                                                    dtype, "y")]))


def per_multiply_add(body: list) -> str:
    """Instructions of a 32-bit Arm loop per int8 product it computes."""
    products = sum(ARM_PRODUCTS.get(op, 0) for op in body)
    return f"{len(body) / products:.3f}" if products else "-"


def int8_main(targets) -> int:
    from test_int8_dots import hottest_int8_loop, loop_bodies
    from test_relay_conv_channels import conv_model

    from kernelrpc import relay
    from kernelrpc.compiler.vector_isa import vector_isa

    print(f"{'layer':<24} {'target':<28} {'int8 record':>12} {'vectors':>8} {'float32':>9}")
    for name, (x, w, strides, pads) in INT8_LAYERS.items():
        for target in targets:
            figures = []
            for lowest in (-127, -128):
                lib = relay.build(int8_conv(x, w, strides, pads, lowest), target=target)
                figures.append(per_multiply_add(hottest_int8_loop(lib.get_source("asm"),
                                                                  target.arch)))
            model = conv_model(x=x, w=w, strides=strides, pads=pads)[0]
            mod, params = relay.frontend.from_onnx(model)
            lib = relay.build(mod, target=target, params=params)
            if "winograd" in str(lib.ir_mod):
                figures.append("winograd")
            else:
                bodies = loop_bodies(lib.get_source("asm"), target.arch).values()
                body = max(bodies, key=lambda b: sum(1 for op in b if FLOAT_MULTIPLY.match(op)))
                lanes = vector_isa(target).lanes
                multiplies = sum(1 for op in body if FLOAT_MULTIPLY.match(op)) * lanes
                figures.append(f"{len(body) / multiplies:.3f}")
            print(f"{name:<24} {str(target)[:28]:<28} {figures[0]:>12} {figures[1]:>8} "
                  f"{figures[2]:>9}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=None, help="semicolon-separated target strings")
    parser.add_argument("--int8", action="store_true",
                        help="int8 records against float32 (32-bit Arm's int8 products)")
    opts = parser.parse_args()
    from kernelrpc.compiler.target import Target

    if opts.int8:
        targets = [Target(t) for t in (opts.targets or INT8_TARGETS).split(";")]
        others = [str(t) for t in targets if not t.arch.startswith(("arm", "thumb"))]
        if others:
            parser.error(f"--int8 counts 32-bit Arm's int8 products; not a 32-bit Arm target: "
                         f"{', '.join(others)} (aarch64's loops: tests/test_int8_dots.py)")
        return int8_main(targets)
    opts.targets = opts.targets or TARGETS
    from kernelrpc import relay
    from kernelrpc.compiler.inner_loop import hottest_loop
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
