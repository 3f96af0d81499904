"""The device bundle: one zipapp with the standard-library-only server, run as users run it."""
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
import zipfile

import numpy as np
import pytest

from kernelrpc import rpc
from kernelrpc.deploy import bundle
from kernelrpc.errors import RemoteError
from servicectl import READY

BLOCKED = ("numpy", "llvmlite", "tornado", "cloudpickle", "prometheus_client")

# Runs the bundle with the host's heavy packages made unimportable and kernelrpc's source
# tree off the path: everything the server uses must come from the zip.
RUN_BLOCKED = textwrap.dedent("""
    import faulthandler, importlib.abc, runpy, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(name + " is blocked: the bundle must not need it")
    sys.meta_path.insert(0, Block())
    sys.path = [p for p in sys.path if not p.endswith("/src")]
    sys.argv = [{pyz!r}, *sys.argv[1:]]
    runpy.run_path({pyz!r}, run_name="__main__")
""")


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return bundle.build_bundle(tmp_path_factory.mktemp("bundle") / "kernelrpc-device.pyz")


def test_bundle_holds_the_device_runtime_and_nothing_of_the_host_side(pyz):
    with zipfile.ZipFile(pyz) as archive:
        names = {name for name in archive.namelist() if not name.endswith("/")}
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    for needed in ("__main__.py", "kernelrpc/server/__main__.py", "kernelrpc/server/registration.py",
                   "kernelrpc/server/through_proxy.py", "kernelrpc/runtime/module.py",
                   "kernelrpc/runtime/device_info.py", "kernelrpc/wire/protocol.py"):
        assert needed in names, needed
    for name in names:
        assert not name.startswith(("kernelrpc/compiler/", "kernelrpc/te/", "kernelrpc/tracker/",
                                    "kernelrpc/proxy/", "kernelrpc/deploy/", "kernelrpc/rpc/")), name
        assert name.endswith(".py"), name


def test_bundle_serves_sessions_without_numpy_or_the_source_tree(pyz, fixture_module, start_service):
    tracker = start_service("kernelrpc.tracker", ["--port", "0"])
    script = RUN_BLOCKED.format(blocked=BLOCKED, pyz=str(pyz))
    proc = subprocess.Popen([sys.executable, "-c", script, "--port", "0", "--tracker",
                             f"127.0.0.1:{tracker.port}", "--key", "bundled"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        before = _ready_line(proc, timeout=60)
        if before:      # the server serves anyway; what it said is kept in the test's report
            warnings.warn(f"the bundled server before its ready line: {before}")
        with rpc.connect_tracker("127.0.0.1", tracker.port).request("bundled", session_timeout=60) as remote:
            remote.upload(fixture_module, "kernels.so")
            module = remote.load_module("kernels.so")
            a = remote.array(np.arange(1024, dtype="float32"))
            b = remote.empty((1024,), "float32")
            module["addone"](a, b)
            np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
            assert module.time_evaluator("addone", remote.cpu(0), number=2, repeat=2)(a, b).mean > 0
            assert remote.target().startswith("llvm")
            with pytest.raises(RemoteError) as failure:
                remote.get_function("no.such")
            assert f"{pyz}/kernelrpc/server/registry.py" in failure.value.traceback_text
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def _ready_line(proc, timeout: float) -> str:
    """Once the server's ready line is out, what it printed before it (a warning of its
    warm-up on a loaded host, seen in CI), else a failure with its output and where each of
    its threads waits (RUN_BLOCKED's SIGUSR1 handler dumps the stacks)."""
    lines: list[str] = []
    ready = threading.Event()

    def read():             # to the end, so that the server never waits on a full pipe
        for line in proc.stdout:
            lines.append(line)
            if READY.search(line):
                ready.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if ready.wait(timeout):
        return "".join(itertools.takewhile(lambda line: not READY.search(line), lines))
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGUSR1)
        reader.join(5)
        proc.kill()
    reader.join(5)
    pytest.fail(f"the bundled server printed no ready line in {timeout} s; its output:\n"
                + "".join(lines))


def test_bundle_help_is_the_servers(pyz):
    out = subprocess.run([sys.executable, str(pyz), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert "--tracker HOST:PORT" in out.stdout and "--through-proxy" in out.stdout


def test_bundle_command_writes_the_file(tmp_path):
    out = tmp_path / "dev.pyz"
    proc = subprocess.run([sys.executable, "-m", "kernelrpc.deploy", "bundle", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert zipfile.is_zipfile(out) and f"{out.stat().st_size // 1024} KB" in proc.stdout
    assert "python3 dev.pyz --tracker HOST:PORT --key KEY" in proc.stdout
