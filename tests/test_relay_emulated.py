"""A whole network on emulated boards: built on this host for the target each board reports,
run there through its graph executor, checked against onnxruntime here (the model issue's
"at least mobilenet-v2 on aarch64 and armv7"), with the default schedules and with every
layer's last configuration of its tuning space (the largest tiles, the other loop order,
unrolled)."""
import contextlib
import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from emulated_boards import need_qemu, start_board  # noqa: E402
from kernelrpc import autotvm, relay, rpc  # noqa: E402
from kernelrpc.autotvm.record import VERSION  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.relay.testing import (mobilenet_v2, model_input, onnxruntime_outputs,  # noqa: E402
                                     resnet18)
from servicectl import Service  # noqa: E402

pytestmark = pytest.mark.cross

BOARDS = {"aarch64": ("aarch64", ()), "armv7": ("armv7", ()),
          "armv7-vfp3d16": ("armv7", ("--cpu", "cortex-r5f")), "riscv64": ("riscv64", ())}


@pytest.fixture(scope="module")
def tracker():
    service = Service("kernelrpc.tracker", ["--port", "0"])
    yield service
    service.stop()


@pytest.fixture(scope="module")
def network():
    model = mobilenet_v2(size=32, width=0.35, classes=50)
    mod, params = relay.frontend.from_onnx(model)
    feeds = model_input(model)
    return model, mod, params, feeds, onnxruntime_outputs(model, feeds)[0]


def last_configurations(mod, params, target) -> list:
    """A log naming each task's last configuration as its best."""
    records = []
    for task in autotvm.task.extract_from_program(mod, target=target, params=params):
        config = task.config_space.get(len(task.config_space) - 1)
        records.append(json.loads(json.dumps({
            "version": VERSION, "workload": [task.name, *task.args], "target": task.target,
            "config": {"index": config.index, "knobs": config.to_dict()},
            "result": {"status": "ok", "costs": [1.0], "mean": 1.0}})))
    return records


def run_network(remote, lib, path, feeds):
    lib.export_library(path)
    remote.upload(str(path))
    rlib = remote.load_module(path.name)
    assert rlib.target["triple"] == lib.target.triple
    m = graph_executor.GraphModule(rlib["default"](remote.cpu(0)))
    m.set_input(**feeds)
    m.run()
    return m, m.get_output(0).numpy()


def run_checked(remote, lib, path, feeds, expected, what):
    """The network run on the board and its output checked against onnxruntime's; skipped
    where this host cannot link for the board."""
    try:
        m, got = run_network(remote, lib, path, feeds)
    except ToolchainError as exc:
        pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-3 * np.abs(expected).max(),
                               err_msg=what)
    return m


@contextlib.contextmanager
def board_session(tracker, board_name):
    """A session on an emulated board started for the test (stopped after it)."""
    arch, extra = BOARDS[board_name]
    need_qemu(arch)
    board = start_board(arch, tracker.port, board_name, *extra)
    try:
        with rpc.connect_tracker("127.0.0.1", tracker.port).request(
                board_name, session_timeout=600) as remote:
            yield remote
    finally:
        assert board.stop() == 0, "\n".join(board.lines)


@pytest.mark.parametrize("board_name", sorted(BOARDS))
def test_mobilenet_v2_on_an_emulated_board(tracker, tmp_path, network, board_name):
    model, mod, params, feeds, expected = network
    with board_session(tracker, board_name) as remote:
        target = remote.target()
        lib = relay.build(mod, target=target, params=params)
        m = run_checked(remote, lib, tmp_path / "mobilenet.so", feeds, expected, board_name)
        assert len(m.module.profile_times(1)) == len(lib.executor["kernels"])
        with autotvm.apply_history_best(last_configurations(mod, params, target)):
            tuned = relay.build(mod, target=target, params=params)
        assert {k["schedule"] for k in tuned.executor["kernels"]} == {"tuned", ""}
        run_checked(remote, tuned, tmp_path / "mobilenet-tuned.so", feeds, expected,
                    f"{board_name}, last configurations")


@pytest.mark.parametrize("board_name", ["aarch64", "armv7"])
def test_winograd_layers_on_an_emulated_board(tracker, tmp_path, board_name):
    """ResNet-18's 3x3 layers run as Winograd's F(4x4) and F(2x2) on the 4-lane NEON targets,
    its dense layer in the ``rows`` order."""
    model = resnet18(size=64, width=0.25, classes=128)        # its dense layer reads by rows
    mod, params = relay.frontend.from_onnx(model)
    feeds = model_input(model)
    expected = onnxruntime_outputs(model, feeds)[0]
    with board_session(tracker, board_name) as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        transformed = {p.shape[0] - 2 for p in lib.get_params().values()
                       if p.ndim == 5 and p.shape[0] == p.shape[1] and p.shape[0] in (4, 6)}
        assert transformed == {2, 4}, "F(4x4) and F(2x2) layers expected"
        run_checked(remote, lib, tmp_path / "resnet.so", feeds, expected, board_name)


@pytest.mark.parametrize("board_name", ["aarch64", "riscv64"])
def test_transformers_on_an_emulated_board(tracker, tmp_path, board_name):
    """The matrix-product tiles and the row softmax on a 4-lane board and a scalar one."""
    from kernelrpc.relay.testing import transformer

    with board_session(tracker, board_name) as remote:
        target = remote.target()
        for kind in ("bert", "gpt2"):
            model = transformer(kind, seq=37, width=32, heads=2, layers=1, ffn=2)
            feeds = model_input(model)
            expected = onnxruntime_outputs(model, feeds)[0]
            mod, params = relay.frontend.from_onnx(model)
            lib = relay.build(mod, target=target, params=params)
            run_checked(remote, lib, tmp_path / f"{kind}.so", feeds, expected,
                        f"{kind} on {board_name}")
