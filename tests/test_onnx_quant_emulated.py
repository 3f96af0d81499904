"""Quantized networks built on this host for an emulated aarch64 board, run there, and
checked against onnxruntime here by the rule of tests/test_onnx_quant.py (a quantized output
within one quantization step, a float one within 1e-4 of its largest magnitude): the CNN in
QDQ form (per-channel, uint8 activations, int8 weights: the packed convolutions and dense
layer without a dot-product instruction) and the encoder block quantized dynamically."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_onnx_quant import (CNN_CASES, cnn_model, encoder_model, output_steps,  # noqa: E402
                             quantized)
from test_relay_emulated import board_session, run_network, tracker  # noqa: E402,F401

from kernelrpc import relay  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

pytestmark = pytest.mark.cross

NETWORKS = {"cnn-qdq": (cnn_model, (1, 3, 11, 13), CNN_CASES["qdq-u8s8-per-channel"]),
            "encoder-dynamic": (encoder_model, (1, 7, 16), dict(dynamic=True))}


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_quantized_network_on_emulated_aarch64(tracker, tmp_path, name):  # noqa: F811
    build, shape, options = NETWORKS[name]
    model = quantized(tmp_path, build(), shape, **options)
    feeds = {"x": np.asarray(np.random.default_rng(11).standard_normal(shape), np.float32)}
    expected = onnxruntime_outputs(model, feeds)[0]
    step = output_steps(model)[0]
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, "aarch64") as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        assert lib.target.arch == "aarch64"
        try:
            _, got = run_network(remote, lib, tmp_path / "int8.so", feeds)
        except ToolchainError as exc:
            pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
    bound = step * (1 + 1e-5) if step is not None else 1e-4 * np.abs(expected).max()
    assert np.abs(got - expected).max() <= bound
    assert got.reshape(-1, got.shape[-1]).argmax(-1).tolist() == \
        expected.reshape(-1, expected.shape[-1]).argmax(-1).tolist()
