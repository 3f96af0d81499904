"""A quantized network (QDQ, per-channel, uint8 activations and int8 weights) built on this
host for an emulated aarch64 board, run there, and checked against onnxruntime here within
one quantization step of the output (the rule of tests/test_onnx_quant.py)."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_onnx_quant import CNN_CASES, cnn_model, output_steps, quantized  # noqa: E402
from test_relay_emulated import board_session, run_network, tracker  # noqa: E402,F401

from kernelrpc import relay  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

pytestmark = pytest.mark.cross


def test_quantized_cnn_on_emulated_aarch64(tracker, tmp_path):  # noqa: F811
    model = quantized(tmp_path, cnn_model(), (1, 3, 11, 13), **CNN_CASES["qdq-u8s8-per-channel"])
    feeds = {"x": np.asarray(np.random.default_rng(11).standard_normal((1, 3, 11, 13)),
                             np.float32)}
    expected = onnxruntime_outputs(model, feeds)[0]
    (step,) = output_steps(model)
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, "aarch64") as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        try:
            _, got = run_network(remote, lib, tmp_path / "int8.so", feeds)
        except ToolchainError as exc:
            pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
    assert np.abs(got - expected).max() <= step * (1 + 1e-5)
    assert got.argmax() == expected.argmax()
