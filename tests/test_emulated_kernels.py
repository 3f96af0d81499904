"""Build on the host for the board it asks, measure on the board: the whole flow, emulated.

For each emulated board (``python -m kernelrpc.deploy emulate``, registered with a real
tracker): ask it for its target (``remote.target()``), build kernels for that target on
this host (the tutorial's final GEMM schedule among them), upload, load, run, compare
with numpy on the host, and take timings with ``time_evaluator``. The armv7 board
without NEON (qemu ``-cpu cortex-r5f``, VFPv3-D16 like Raspberry Pi OS's baseline)
traps on any NEON instruction, so its results also prove the target it reported.
"""
import numpy as np
import pytest

import kernelrpc
from emulated_boards import need_qemu, start_board
from kernelrpc import rpc, te
from kernelrpc.compiler import recipes
from kernelrpc.deploy.toolchain import ToolchainError
from servicectl import Service

pytestmark = pytest.mark.cross

GEMM = (48, 40, 36)           # not multiples of the tutorial's 32x32 blocks: tails are exercised
BOARDS = {"aarch64": ("aarch64", ()), "armv7": ("armv7", ()),
          "armv7-vfp3d16": ("armv7", ("--cpu", "cortex-r5f")), "riscv64": ("riscv64", ())}


def _kernels():
    """(name, schedule, args, inputs (None: output), numpy reference, tolerance)."""
    rng = np.random.default_rng(3)
    M, N, K = GEMM
    s, args = recipes.tutorial_schedule("parallel", M, N, K)
    a, b = rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)
    yield "gemm", s, args, [a, b, None], lambda a, b: a @ b, 1e-4

    n = 1003
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + te.exp(A[i] * 0.25), name="C")
    s = te.create_schedule(C.op)
    outer, inner = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(inner)
    x, y = rng.standard_normal(n, np.float32), rng.standard_normal(n, np.float32)
    yield "fma_exp", s, [A, B, C], [x, y, None], lambda a, b: a * b + np.exp(a * np.float32(0.25)), 1e-5

    m = 129
    X = te.placeholder((m,), name="X", dtype="int64")
    Y = te.compute((m,), lambda i: X[i] // 7 + X[i] % 5, name="Y")
    s = te.create_schedule(Y.op)
    v = rng.integers(-(1 << 40), 1 << 40, m, dtype=np.int64)
    yield "int64_divmod", s, [X, Y], [v, None], lambda v: np.floor_divide(v, 7) + np.mod(v, 5), 0


@pytest.fixture(scope="module")
def tracker():
    service = Service("kernelrpc.tracker", ["--port", "0"])
    yield service
    service.stop()


@pytest.mark.parametrize("board_name", sorted(BOARDS))
def test_kernels_built_for_the_board_it_reports_run_there(tracker, tmp_path, board_name):
    arch, extra = BOARDS[board_name]
    need_qemu(arch)
    board = start_board(arch, tracker.port, board_name, *extra)
    try:
        with rpc.connect_tracker("127.0.0.1", tracker.port).request(board_name, session_timeout=300) as remote:
            target = remote.target()
            if board_name == "armv7-vfp3d16":
                assert target.endswith("-mattr=+vfp3d16,-neon")
            dev = remote.cpu(0)
            for name, s, args, inputs, reference, tol in _kernels():
                module = kernelrpc.build(s, args, target=target, name=name)
                try:
                    path = module.export_library(tmp_path / f"{name}.so")
                except ToolchainError as exc:
                    pytest.skip(f"cross export for {target} is unavailable here: {exc}")
                remote.upload(path)
                remote_module = remote.load_module(path.name)
                assert remote_module.target["triple"] == module.target.triple
                tensors = [remote.array(v, dev) if v is not None else
                           remote.empty(spec["shape"], spec["dtype"], dev)
                           for v, spec in zip(inputs, module.metadata["functions"][0]["args"])]
                remote_module[name](*tensors)
                expected = reference(*[v for v in inputs if v is not None])
                got = tensors[-1].numpy()
                if tol:
                    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=f"{board_name} {name}")
                else:
                    np.testing.assert_array_equal(got, expected, err_msg=f"{board_name} {name}")
                timing = remote_module.time_evaluator(name, dev, number=2, repeat=2)(*tensors)
                assert len(timing.results) == 2 and all(t > 0 for t in timing.results)
    finally:
        assert board.stop() == 0, "\n".join(board.lines)
