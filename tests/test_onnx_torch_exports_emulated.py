"""Networks as torch's exporters write them (``test_onnx_torch_exports``) on an emulated aarch64
board: transformers' BERT as the dynamo exporter writes it, the CRNN recognizer and the
YOLOv8-style head as the TorchScript exporter does, built for the board's target, run there
and checked against onnxruntime here within 1e-4 of the output's scale. One board for the
three, each network by one exporter: emulation is slow."""
import pytest
from onnx_check import compare
from test_onnx_torch_exports import NETWORKS, TOL, exported_or_skip
from test_relay_emulated import board_session, run_checked, tracker  # noqa: F401

from kernelrpc import relay
from kernelrpc.relay.testing import onnxruntime_outputs

pytestmark = pytest.mark.cross

ON_THE_BOARD = (("bert", "dynamo"), ("crnn", "torchscript"), ("yolo_head", "torchscript"))


def test_exported_networks_on_an_emulated_aarch64_board(tracker, tmp_path):  # noqa: F811
    models = {name: exported_or_skip(name, exporter) for name, exporter in ON_THE_BOARD}
    with board_session(tracker, "aarch64") as remote:
        target = remote.target()
        for name, model in models.items():
            feeds = NETWORKS[name].inputs
            expected = onnxruntime_outputs(model, feeds)
            mod, params = relay.frontend.from_onnx(model, shape=NETWORKS[name].shapes)
            lib = relay.build(mod, target=target, params=params)
            m = run_checked(remote, lib, tmp_path / f"{name}.so", feeds, expected[0],
                            f"{name} on aarch64")
            compare([m.get_output(0).numpy()], expected, TOL)
