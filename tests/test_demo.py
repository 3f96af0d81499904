import re
import subprocess
import sys

from servicectl import child_env


def test_demo_runs_a_kernel_remotely_through_the_tracker(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "demo", "--size", "100", "--repeat", "2"],
                         capture_output=True, text=True, env=child_env(), timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lib = tmp_path / "gemm.so"
    assert f"-> {lib} (" in out.stdout and lib.stat().st_size > 0   # left where the user is
    assert re.search(r"device\s+127\.0\.0\.1:\d+ registered as key 'demo'", out.stdout)
    assert re.search(r"max relative error \d\.\de[-+]\d\d", out.stdout)
    assert re.search(r"kernelrpc gemm \(remote\)\s+\d+\.\d+\s+\d+\.\d", out.stdout)


def test_cli_lists_commands():
    out = subprocess.run([sys.executable, "-m", "kernelrpc", "--help"], capture_output=True, text=True,
                         env=child_env(), timeout=60)
    assert out.returncode == 0 and "demo" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "kernelrpc", "nope"], capture_output=True, text=True,
                         env=child_env(), timeout=60)
    assert bad.returncode == 2 and "usage" in bad.stderr
