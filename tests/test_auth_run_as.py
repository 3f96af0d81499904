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
from kernelrpc.server.privileges import SessionUser
from servicectl import child_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs a server started as root")

NOBODY = pwd.getpwnam("nobody")
ROOT_ONLY_PYTHON = not SessionUser("nobody", NOBODY.pw_uid, NOBODY.pw_gid).can_search(
    Path(sys.executable).resolve().parent)
SYSTEM_PYTHON = "/usr/bin/python3"
"""The device server is standard-library only: the system's Python, which every user can
run, serves sessions as nobody (this test run's own Python may live under /root)."""


@pytest.fixture
def python_for_nobody():
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to run a server whose sessions can run as nobody")
    ok = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; sys.exit(sys.version_info < (3, 9))"])
    if ok.returncode != 0:
        pytest.skip(f"{SYSTEM_PYTHON} is too old for the device server")
    return SYSTEM_PYTHON


@pytest.fixture
def workspace_root():
    root = tempfile.mkdtemp(prefix="kernelrpc-run-as-test-", dir="/tmp")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def owner_of_upload(start_service, workspace_root, python, *flags):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--workspace-root",
                                                workspace_root, *flags], python=python)
    with rpc.connect(server.host, server.port, key="dev", connect_timeout=10) as sess:
        sess.upload(b"written by the session", "probe.txt")
        probe = next(Path(workspace_root).rglob("probe.txt"))
        return probe.stat().st_uid, server


def test_sessions_run_as_nobody_by_default(start_service, workspace_root, python_for_nobody):
    uid, server = owner_of_upload(start_service, workspace_root, python_for_nobody)
    assert uid == NOBODY.pw_uid
    server.wait_for_line("sessions run as user nobody", timeout=10)


def test_run_as_root_keeps_root(start_service, workspace_root, python_for_nobody):
    uid, _ = owner_of_upload(start_service, workspace_root, python_for_nobody, "--run-as", "root")
    assert uid == 0


@pytest.mark.skipif(not ROOT_ONLY_PYTHON, reason="this Python is reachable by nobody")
def test_default_user_who_cannot_reach_python_keeps_root_with_a_warning(start_service, workspace_root):
    uid, server = owner_of_upload(start_service, workspace_root, None)
    assert uid == 0
    assert "Python interpreter" in server.wait_for_line("sessions run as root", timeout=10)


def test_modules_load_and_run_in_a_session_as_nobody(start_service, workspace_root, fixture_module,
                                                     python_for_nobody):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--workspace-root",
                                                workspace_root], python=python_for_nobody)
    server.wait_for_line("sessions run as user nobody", timeout=10)
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
