"""A server started as root runs its sessions as an unprivileged user (--run-as)."""
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kernelrpc import rpc
from servicectl import child_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs a server started as root")


@pytest.fixture
def workspace_root():
    root = tempfile.mkdtemp(prefix="kernelrpc-run-as-test-", dir="/tmp")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def owner_of_upload(start_service, workspace_root, *flags):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--workspace-root",
                                                workspace_root, *flags])
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as sess:
        sess.upload(b"written by the session", "probe.txt")
        probe = next(Path(workspace_root).rglob("probe.txt"))
        return probe.stat().st_uid, server


def test_sessions_run_as_nobody_by_default(start_service, workspace_root):
    uid, server = owner_of_upload(start_service, workspace_root)
    assert uid == pwd.getpwnam("nobody").pw_uid
    assert any("sessions run as user nobody" in line for line in server.lines)


def test_run_as_root_keeps_root(start_service, workspace_root):
    uid, _ = owner_of_upload(start_service, workspace_root, "--run-as", "root")
    assert uid == 0


def test_modules_load_and_run_in_a_session_as_nobody(start_service, workspace_root, fixture_module):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--workspace-root", workspace_root])
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as sess:
        sess.upload(fixture_module, "kernels.so")
        assert sess.load_module("kernels.so") is not None   # loading still works as nobody
        assert sess.get_function("testing.echo")("ok") == "ok"


def run_server(*args):
    return subprocess.run([sys.executable, "-m", "kernelrpc.server", "--port", "0", *args],
                          capture_output=True, text=True, env=child_env(), timeout=20)


def test_unknown_user_is_a_start_up_error():
    done = run_server("--run-as", "no-such-user-kernelrpc")
    assert done.returncode == 2 and "no user 'no-such-user-kernelrpc'" in done.stderr


def test_explicit_user_who_cannot_reach_the_workspace_is_a_start_up_error(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    done = run_server("--run-as", "nobody", "--workspace-root", str(hidden))
    assert done.returncode == 2 and "cannot reach the workspace directory" in done.stderr
