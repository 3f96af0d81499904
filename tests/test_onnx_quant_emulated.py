"""Quantized networks built on this host for emulated aarch64 and armv7 boards, run there, and
checked against onnxruntime here by the rule of tests/test_onnx_quant.py (a quantized output
within one quantization step, a float one within 1e-4 of its largest magnitude): the CNN in
QDQ form (per-channel, uint8 activations, int8 weights) on a Cortex-A72 (no dot product: the
packed layers' ``smull``/``addp``/``sadalp``) and on a Cortex-A76 (``sdot``), both on the
input shifted by 128 from the weight sums the packed weight carries, and the encoder block
quantized dynamically; on each board the packed convolution's kernel with int8 and uint8
inputs at both ends of their range against numpy (on the A72 and the armv7 board with a
weight of -128 too, which the plain vectors take); the CNN and the kernels on the armv7 board
(Cortex-A7, NEON: ``vmull.s8``/``vmlal.s8``/``vpadal.s16``), with int16 lanes at their bound."""
import contextlib
import re

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from emulated_boards import start_board  # noqa: E402
from test_onnx_quant import (CNN_CASES, cnn_model, encoder_model, output_steps,  # noqa: E402
                             quantized)
from test_relay_emulated import board_session, run_network, tracker  # noqa: E402,F401

from kernelrpc import relay, rpc  # noqa: E402
from kernelrpc.relay import ir  # noqa: E402
from kernelrpc.relay.op import quant  # noqa: E402
from kernelrpc.compiler.vector_isa import int8_dot  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

pytestmark = pytest.mark.cross

NETWORKS = {"cnn-qdq": (cnn_model, (1, 3, 11, 13), CNN_CASES["qdq-u8s8-per-channel"]),
            "encoder-dynamic": (encoder_model, (1, 7, 16), dict(dynamic=True))}


@contextlib.contextmanager
def dotprod_board(tracker):  # noqa: F811
    """An emulated aarch64 board whose CPU is a Cortex-A76 (ARMv8.2 with the dot product)."""
    board = start_board("aarch64", tracker.port, "aarch64-a76", "--cpu", "cortex-a76")
    try:
        with rpc.connect_tracker("127.0.0.1", tracker.port).request(
                "aarch64-a76", session_timeout=600) as remote:
            yield remote
    finally:
        assert board.stop() == 0, "\n".join(board.lines)


def check_network(remote, tmp_path, name):
    build, shape, options = NETWORKS[name]
    model = quantized(tmp_path, build(), shape, **options)
    feeds = {"x": np.asarray(np.random.default_rng(11).standard_normal(shape), np.float32)}
    expected = onnxruntime_outputs(model, feeds)[0]
    step = output_steps(model)[0]
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target=remote.target(), params=params)
    try:
        _, got = run_network(remote, lib, tmp_path / "int8.so", feeds)
    except ToolchainError as exc:
        pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
    bound = step * (1 + 1e-5) if step is not None else 1e-4 * np.abs(expected).max()
    assert np.abs(got - expected).max() <= bound
    assert got.reshape(-1, got.shape[-1]).argmax(-1).tolist() == \
        expected.reshape(-1, expected.shape[-1]).argmax(-1).tolist()
    return lib


def check_kernels(remote, tmp_path, instruction, fallback):
    """The packed convolution (and a pointwise one in the ``pixels`` form, and a 3x3 one of 3
    input channels in that form over its taps) on the board equals numpy's, the record's
    ``instruction`` in its code; a weight of -128 (outside the smull and vmlal records'
    bound) takes the plain vectors, their ``fallback`` instruction (the same for sdot, which
    takes any weight)."""
    from test_int8_dots import packed_conv_case

    cases = [("int8", 127, (-127, 127), instruction, None),
             ("uint8", 255, (-127, 127), instruction, None),
             ("int8", -128, (-128, 127), fallback, None),
             ("uint8", 0, (-127, 127), instruction, "pixels"),
             ("int8", 3, (-127, 127), instruction, "window")]
    for k, (data_dtype, x_zero, weight_range, expected, form) in enumerate(cases):
        if form == "window":
            case = packed_conv_case(data_dtype, x_zero, 3, 21, (2, 2), weight_range,
                                    size=(8, 16), window=True)
        else:
            case = packed_conv_case(data_dtype, x_zero, 6, 21, (1, 1) if form else (2, 1),
                                    weight_range, form == "pixels")
        node, data, x, numpy_answer = case
        lib = relay.build(ir.IRModule(ir.Function([data], [node])), target=remote.target())
        asm = lib.get_source("asm")
        assert re.search(rf"\b{re.escape(expected)}\b", asm)
        assert (re.search(rf"\b{re.escape(instruction)}\b", asm) is not None) == \
            (expected == instruction)
        _, got = run_network(remote, lib, tmp_path / f"conv{k}.so", {"x": x})
        np.testing.assert_array_equal(got, numpy_answer)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_quantized_network_on_emulated_aarch64(tracker, tmp_path, name):  # noqa: F811
    with board_session(tracker, "aarch64") as remote:
        lib = check_network(remote, tmp_path, name)
        assert int8_dot(lib.target) == "asimd" and "sdot" not in lib.get_source("asm")
        if name == "cnn-qdq":
            assert re.search(r"\bsadalp\b", lib.get_source("asm"))
            check_kernels(remote, tmp_path, "sadalp", "smlal")


def test_sdot_on_an_emulated_cortex_a76(tracker, tmp_path):  # noqa: F811
    with dotprod_board(tracker) as remote:
        lib = check_network(remote, tmp_path, "cnn-qdq")
        assert int8_dot(lib.target) == "dotprod" and "sdot" in lib.get_source("asm")
        check_kernels(remote, tmp_path, "sdot", "sdot")


def check_pair_bound(remote, tmp_path):
    """The vmlal record's int16 lanes at their bound: weights of +-127 in pairs of one sign,
    inputs at both ends (0 and 255, shifted by 128: -128 and 127), so that two products of a
    lane reach 2 x 128 x 127 = 32512 and -32512; each output (a multiplier of 2**-11, so
    that none is clipped) exactly numpy's."""
    from test_onnx_quant import make

    weight = np.full((16, 8, 1, 1), 127, np.int8)
    weight[1::2] = -127
    weight[:, 2:4] *= -1                       # each quad's second pair of the other sign
    data = ir.Node("input", (), {}, (1, 8, 3, 5), "uint8", "x")
    x = np.zeros((1, 8, 3, 5), np.uint8)
    x[..., 2:] = 255
    x[:, 2:4, :, 1] = 255
    x[:, :, 0, 4] = np.random.default_rng(5).integers(0, 256, 8)
    attrs = dict(strides=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), groups=1,
                 out_zero=128, out_min=0, out_max=255, out_dtype="uint8",
                 kernel_layout=quant.PACKED)
    scale = np.full(16, 2.0 ** -11, np.float32)
    bias = np.arange(16, dtype=np.int32) * 997
    inputs = [data, ir.const(quant.pack_weight(weight)), ir.const(np.asarray(0, np.int32)),
              ir.const(quant.packed_bias(bias, weight, "uint8", 0)), ir.const(scale)]
    node = make("qnn.conv2d", inputs, **attrs)
    lib = relay.build(ir.IRModule(ir.Function([data], [node])), target=remote.target())
    assert re.search(r"\bvmlal\.s8\b", lib.get_source("asm"))
    _, got = run_network(remote, lib, tmp_path / "bound.so", {"x": x})
    expected = quant.np_qconv2d([x, weight, np.asarray(0), bias, scale],
                                dict(attrs, kernel_layout="OIHW"))
    assert 0 < expected.min() and expected.max() < 255 and len(np.unique(expected)) > 8
    np.testing.assert_array_equal(got, expected)


def test_vmlal_on_an_emulated_armv7(tracker, tmp_path):  # noqa: F811
    """The armv7 board (Cortex-A7, NEON): the CNN within one quantization step of onnxruntime,
    its packed layers the vmlal record's, the kernels against numpy, at the int16 bound too."""
    with board_session(tracker, "armv7") as remote:
        lib = check_network(remote, tmp_path, "cnn-qdq")
        assert int8_dot(lib.target) == "neon"
        assert re.search(r"\bvpadal\.s16\b", lib.get_source("asm"))
        check_kernels(remote, tmp_path, "vmlal.s8", "vmla.i32")
        check_pair_bound(remote, tmp_path)
