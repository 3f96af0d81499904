"""The operators of the comparison, logic and data-movement groups on emulated boards
(aarch64, armv7, riscv64): a small network with a token-embedding lookup (run-time indices),
a causal mask built from Range, Less and Where (folded at import), GatherElements and
ScatterND, built for the board's target, run there and checked against onnxruntime here; an
index out of range on the board is an error of the run, as on the host; float16 inputs and
outputs converted on the boards as onnxruntime rounds."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_check import N, graph_model, rand  # noqa: E402
from test_onnx_dtypes import assert_same_halves, exact_half_model  # noqa: E402
from test_relay_emulated import (  # noqa: E402,F401
    board_session,
    run_checked,
    run_network,
    tracker,
)

from kernelrpc import relay  # noqa: E402
from kernelrpc.deploy.toolchain import ToolchainError  # noqa: E402
from kernelrpc.errors import RemoteError  # noqa: E402
from kernelrpc.relay.testing import onnxruntime_outputs  # noqa: E402

RNG = np.random.default_rng(29)

pytestmark = pytest.mark.cross


def _network():
    scalar = {n: np.asarray(v, np.int64) for n, v in (("zero", 0), ("one", 1), ("n", 6))}
    nodes = [N("Gather", ["table", "ids"], ["emb"]),                    # [6, 8]
             N("Range", ["zero", "n", "one"], ["r"]),
             N("Unsqueeze", ["r", "ax1"], ["col"]),
             N("Less", ["col", "r"], ["future"]),                       # [6, 6] causal mask
             N("Transpose", ["emb"], ["embT"], perm=[1, 0]),
             N("MatMul", ["emb", "embT"], ["scores0"]),
             N("Where", ["future", "low", "scores0"], ["scores"]),
             N("GatherElements", ["scores", "pick"], ["picked"], axis=1),
             N("Transpose", ["picked"], ["picked_t"], perm=[1, 0]),
             N("ScatterND", ["scores", "rows", "picked_t"], ["y"], reduction="add")]
    inits = {"table": rand(RNG, 20, 8), "ax1": np.array([1], np.int64),
             "low": np.asarray(-1e4, np.float32), "rows": np.array([[1], [4]], np.int64),
             **scalar}
    inputs = {"ids": np.array([3, 19, -1, 0, 7, 7], np.int64),
              "pick": np.array([[0, 5]] * 6, np.int64)}
    return graph_model(nodes, inputs, ["y"], inits, opset=16), inputs


@pytest.mark.parametrize("board_name", ["aarch64", "armv7", "riscv64"])
def test_indices_masks_and_scatters_on_an_emulated_board(tracker, tmp_path,  # noqa: F811
                                                         board_name):
    """int64 indices compared in int64 on 32-bit armv7 too."""
    model, feeds = _network()
    expected = onnxruntime_outputs(model, feeds)[0]
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, board_name) as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        m = run_checked(remote, lib, tmp_path / "net.so", feeds, expected, board_name)
        m.set_input("ids", np.array([3, 2**32 + 1, 0, 0, 0, 0], np.int64))
        with pytest.raises(RemoteError, match="out of bounds"):
            m.run()


@pytest.mark.parametrize("board_name", ["aarch64", "armv7", "armv7-vfp3d16"])
def test_float16_boundary_on_an_emulated_board(tracker, tmp_path, board_name):  # noqa: F811
    """Every float16 bit pattern in and out of the board's network, rounded as onnxruntime
    rounds: aarch64's fcvtl/fcvtn, armv7's VFPv4 vcvtb, libgcc's __gnu_h2f_ieee and
    __gnu_f2h_ieee on the Cortex-R5F (VFPv3-D16, no half conversions)."""
    model, feeds = exact_half_model()
    expected = onnxruntime_outputs(model, feeds)
    mod, params = relay.frontend.from_onnx(model)
    with board_session(tracker, board_name) as remote:
        lib = relay.build(mod, target=remote.target(), params=params)
        try:
            m, _ = run_network(remote, lib, tmp_path / "half.so", feeds)
        except ToolchainError as exc:
            pytest.skip(f"cross export for {lib.target.triple} is unavailable here: {exc}")
        assert_same_halves([m.get_output(k).numpy() for k in range(len(expected))], expected)
