"""Device servers on emulated aarch64, armv7 and riscv64 boards, reached through a real tracker.

Each board is ``python -m kernelrpc.deploy emulate`` (qemu-user running the Debian Python of
that architecture, no numpy); the client is this process, on the host.
"""
import json
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from emulated_boards import need_qemu, start_board
import kernelrpc
from kernelrpc import rpc, te
from kernelrpc.deploy import bundle, emulate, rootfs
from kernelrpc.deploy.toolchain import zig_installed
from kernelrpc.errors import RemoteError
from servicectl import Service

pytestmark = pytest.mark.cross

TRIPLES = {"aarch64": "aarch64-linux-gnu", "armv7": "armv7-linux-gnueabihf", "riscv64": "riscv64-linux-gnu"}


@pytest.fixture(scope="module")
def tracker():
    service = Service("kernelrpc.tracker", ["--port", "0"])
    yield service
    service.stop()


def _query_json(port: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--port", str(port), "--json"],
                          capture_output=True, text=True, timeout=30)
    return json.loads(proc.stdout)["summary"]


def _exercise(remote, arch: str) -> None:
    """Upload, tensors both ways, remote functions and errors, the device's own description."""
    info = remote.device_info()
    assert info["machine"] == rootfs.arch_named(arch).name
    assert remote.target().startswith(f"llvm -mtriple={TRIPLES[arch]}")
    assert info["cpuinfo_foreign"] is True          # qemu-user shows the host's /proc/cpuinfo

    payload = bytes(range(256)) * 1024
    remote.upload(payload, "data/blob.bin")
    assert remote.listdir("data") == ["blob.bin"]
    assert bytes(remote.download("data/blob.bin")) == payload

    dev = remote.cpu(0)
    for dtype in ("float32", "float64", "int8", "int64", "uint16"):
        host = (np.arange(3000) % 120).astype(dtype).reshape(30, 100)
        tensor = remote.array(host, dev)
        assert tensor.numpy().dtype == host.dtype
        np.testing.assert_array_equal(tensor.numpy(), host)
    empty = remote.empty((4, 5), "float32", dev)
    empty.copyfrom(np.full((4, 5), 2.5, dtype="float32"))
    np.testing.assert_array_equal(empty.numpy(), np.full((4, 5), 2.5, dtype="float32"))

    echo = remote.get_function("testing.echo")
    assert echo(7) == 7 and echo(-1.5) == -1.5 and echo("board") == "board" and echo(b"\x00\xff") == b"\x00\xff"
    system = json.loads(remote.get_function("runtime.system_info")())
    assert system["machine"] == info["machine"] and system["python"] == info["python"]
    with pytest.raises(RemoteError, match="no global function 'no.such'") as failure:
        remote.get_function("no.such")
    assert failure.value.type_name == "LookupError" and "registry.py" in failure.value.traceback_text
    assert echo(1) == 1                              # the session goes on after an error


@pytest.mark.parametrize("arch,stop_signal", [("aarch64", signal.SIGTERM), ("armv7", signal.SIGINT),
                                               ("riscv64", signal.SIGTERM)])
def test_emulated_board_serves_a_session_through_the_tracker(tracker, arch, stop_signal):
    need_qemu(arch)
    key = f"emu-{arch}"
    board = start_board(arch, tracker.port, key)
    try:
        summary = _query_json(tracker.port)
        (entry,) = [s for s in summary["server_info"] if s["key"] == f"server:{key}"]
        assert entry["device"]["machine"] == rootfs.arch_named(arch).name
        assert entry["device"]["target"].startswith(f"llvm -mtriple={TRIPLES[arch]}")
        with rpc.connect_tracker("127.0.0.1", tracker.port).request(key, session_timeout=120) as remote:
            _exercise(remote, arch)
        board.wait_for_line(r"finished after", timeout=30)
    finally:
        assert board.stop(stop_signal) == 0, "\n".join(board.lines)     # a clean exit


def test_bundle_runs_on_the_emulated_aarch64_board(tracker, tmp_path):
    need_qemu("aarch64")
    pyz = bundle.build_bundle(tmp_path / "kernelrpc-device.pyz")
    board = start_board("aarch64", tracker.port, "emu-bundle", "--bundle", str(pyz))
    try:
        with rpc.connect_tracker("127.0.0.1", tracker.port).request("emu-bundle", session_timeout=120) as remote:
            _exercise(remote, "aarch64")
    finally:
        assert board.stop() == 0, "\n".join(board.lines)


BULLSEYE_AMD64 = rootfs.Arch("x86_64", "amd64", "bullseye", "3.9", "qemu-x86_64-static",
                             libssl="libssl1.1", libffi="libffi7")


def _kernel_for_glibc_2_31(tmp_path, monkeypatch):
    """An x86-64 module linked by zig against glibc 2.17 ($CC), so that Debian 11 loads it."""
    if not zig_installed():
        pytest.skip("needs the cross extra (pip install '.[cross]': ziglang)")
    monkeypatch.setenv("CC", f"{sys.executable} -m ziglang cc -target x86_64-linux-gnu.2.17")
    n = 1000
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(B.op)
    outer, inner = s[B].split(B.op.axis[0], factor=8)
    s[B].parallel(outer)
    s[B].vectorize(inner)
    return kernelrpc.build(s, [A, B], target="llvm", name="twice").export_library(tmp_path / "twice.so")


def test_bundle_runs_on_the_oldest_supported_python(tmp_path, monkeypatch):
    """Python 3.9 (Debian 11, Raspberry Pi OS "bullseye"): bundle.MIN_PYTHON, run for real,
    with a parallel kernel, the timer and the cache flush."""
    if shutil.which(BULLSEYE_AMD64.qemu) is None:
        pytest.skip(rootfs.QEMU_PACKAGE_HINT)
    assert bundle.MIN_PYTHON == (3, 9)
    kernel = _kernel_for_glibc_2_31(tmp_path, monkeypatch)
    root = rootfs.prepare(BULLSEYE_AMD64)
    pyz = bundle.build_bundle(tmp_path / "kernelrpc-device.pyz")
    argv, env = emulate.server_command(root, ["--port", "0"], bundle=pyz)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "listening on" in line, line + proc.stdout.read()
        port = int(line.rsplit(":", 1)[1])
        with rpc.connect("127.0.0.1", port, session_timeout=60) as remote:
            assert remote.device_info()["python"].startswith("3.9.")
            tensor = remote.array(np.arange(12, dtype="float32"))
            np.testing.assert_array_equal(tensor.numpy(), np.arange(12, dtype="float32"))
            with pytest.raises(RemoteError, match="no global function"):
                remote.get_function("no.such")
            assert remote.get_function("testing.echo")("ok") == "ok"
            remote.upload(kernel)
            twice = remote.load_module(kernel.name)
            x, y = remote.array(np.arange(1000, dtype="float32")), remote.empty((1000,), "float32")
            twice["twice"](x, y)
            np.testing.assert_array_equal(y.numpy(), np.arange(1000, dtype="float32") * 2 + 1)
            timing = twice.time_evaluator("twice", remote.cpu(0), number=2, repeat=2,
                                          f_preproc="cache_flush_cpu_non_first_arg")(x, y)
            assert timing.repeat == 2 and timing.mean > 0
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
