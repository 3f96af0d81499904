import re
import subprocess
import sys

import pytest

from kernelrpc.compiler.target import Target
from servicectl import child_env
from target_families import FAMILIES, runs_here


def test_demo_runs_a_kernel_remotely_through_the_tracker(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "demo", "--size", "100", "--repeat", "2"],
                         capture_output=True, text=True, env=child_env(), timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lib = tmp_path / "gemm.so"
    assert f"-> {lib} (" in out.stdout and lib.stat().st_size > 0   # left where the user is
    assert re.search(r"device\s+127\.0\.0\.1:\d+ registered as key 'demo'", out.stdout)
    assert re.search(r"max relative error \d\.\de[-+]\d\d", out.stdout)
    assert re.search(r"kernelrpc gemm \(remote\)\s+\d+\.\d+\s+\d+\.\d", out.stdout)
    # the last line: where the output went, and the command that measures again
    last = out.stdout.strip().splitlines()[-1]
    assert last == (f"kernelrpc demo: timings above, compiled library at {lib}; rerun: python -m kernelrpc "
                    f"demo --size 100 --key demo --repeat 2 --output {lib} --target llvm")


def test_demo_builds_for_a_narrower_target_the_host_runs(tmp_path):
    """AVX2 code on an AVX-512 host: the recipe's tile is the target's, the result numpy's."""
    target = FAMILIES["avx2"]
    if not runs_here(Target(target)):
        pytest.skip("this host cannot run AVX2 code")
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "demo", "--size", "70", "--repeat", "1",
                          "--target", target], capture_output=True, text=True, env=child_env(),
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"compiled\s+gemm 70x70x70 float32 for .*-mcpu=haswell", out.stdout)
    assert re.search(r"max relative error \d\.\de[-+]\d\d", out.stdout)


def test_demo_refuses_a_target_this_machine_does_not_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "demo", "--target",
                          "llvm -mtriple=aarch64-linux-gnu"], capture_output=True, text=True,
                         env=child_env(), timeout=60, cwd=tmp_path)
    assert out.returncode == 2
    assert "the demo's device is this machine, which does not run that target's code" in out.stderr
    assert not (tmp_path / "gemm.so").exists()


def test_demo_error_is_one_line_and_the_traceback_is_behind_debug(tmp_path):
    missing = tmp_path / "no-such-dir" / "gemm.so"
    args = [sys.executable, "-m", "kernelrpc", "demo", "--size", "16", "--repeat", "1", "--output", str(missing)]
    out = subprocess.run(args, capture_output=True, text=True, env=child_env(), timeout=240, cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"kernelrpc demo: error: [Errno 2] No such file or directory: '{missing}' (FileNotFoundError); "
        "--log-level debug shows the traceback"]
    debug = subprocess.run(args + ["--log-level", "debug"], capture_output=True, text=True, env=child_env(),
                           timeout=240, cwd=tmp_path)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr and "FileNotFoundError" in debug.stderr


def test_cli_lists_commands():
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "--help"], capture_output=True, text=True,
                         env=child_env(), timeout=60)
    assert out.returncode == 0 and "demo" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "kernelrpc", "nope"], capture_output=True, text=True,
                         env=child_env(), timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
