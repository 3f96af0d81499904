"""Remote files stay inside the session workspace, which the server removes after the session."""
import os

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc

BLOCKED = ("numpy", "llvmlite", "tornado", "cloudpickle")


@pytest.fixture
def workspace_root(tmp_path):
    root = tmp_path / "workspaces"
    root.mkdir()
    return root


@pytest.fixture
def server(start_service, workspace_root):
    return start_service("kernelrpc.server", ["--port", "0", "--key", "dev", "--workspace-root",
                                              str(workspace_root), "--max-upload-bytes", "100000"])


def test_upload_download_listdir_remove(session, tmp_path):
    session.upload(b"hello", "a.txt")
    session.upload(b"nested", "sub/dir/b.bin")
    host_file = tmp_path / "host.dat"
    host_file.write_bytes(os.urandom(70_000))
    session.upload(host_file)
    assert session.listdir() == ["a.txt", "host.dat", "sub"]
    assert session.listdir("sub/dir") == ["b.bin"]
    assert session.download("a.txt") == b"hello"
    assert session.download("host.dat") == host_file.read_bytes()
    session.remove("a.txt")
    assert "a.txt" not in session.listdir()
    session.upload(b"", "empty")
    assert session.download("empty") == b""


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "sub/../../x", "", "a\0b"])
def test_names_outside_the_workspace_are_refused(session, name):
    for op in (lambda: session.upload(b"x", name), lambda: session.download(name),
               lambda: session.remove(name)):
        with pytest.raises(kernelrpc.RemoteError, match="WorkspaceError"):
            op()
    assert session.get_function("testing.echo")(1) == 1


def test_symlinks_leading_out_are_refused(session, workspace_root, tmp_path):
    (tmp_path / "secret").write_text("do not read")
    (only,) = workspace_root.iterdir()
    (only / "link").symlink_to(tmp_path)
    with pytest.raises(kernelrpc.RemoteError, match="outside the session workspace"):
        session.download("link/secret")
    with pytest.raises(kernelrpc.RemoteError, match="outside the session workspace"):
        session.upload(b"x", "link/planted")
    assert not (tmp_path / "planted").exists()


def test_upload_limit(session):
    with pytest.raises(ValueError, match="100000"):
        session.upload(b"x" * 100_001, "big")
    session._check_upload = lambda size: None  # a client that ignores the advertised limit
    with pytest.raises(kernelrpc.RemoteError, match="max-upload-bytes"):
        session.upload(b"x" * 100_001, "big")
    assert session.listdir() == []


def test_parent_removes_the_workspace_when_the_session_ends(server, workspace_root):
    sess = rpc.connect(server.host, server.port, key="dev")
    sess.upload(b"data", "f")
    (workspace,) = workspace_root.iterdir()
    assert (workspace / "f").exists()
    sess.close()
    server.wait_for_line(r"session from .* finished")
    assert not workspace.exists()                      # (the next spare's own workspace may be there)


def test_whole_session_without_numpy_llvmlite_tornado_cloudpickle(start_service, tmp_path, fixture_module):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"BLOCKED = {BLOCKED!r}\n"
        f"open({str(tmp_path / 'loaded')!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "class Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is blocked on this device')\n"
        "sys.meta_path.insert(0, Blocker())\n")
    from servicectl import SRC
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"],
                           env={"PYTHONPATH": f"{blocker}{os.pathsep}{SRC}"})
    with rpc.connect(server.host, server.port, key="dev") as sess:
        sess.upload(fixture_module, "kernels.so")
        module = sess.load_module("kernels.so")
        dev = sess.cpu(0)
        a = nd.array(np.arange(1024, dtype="float32"), dev)
        b = nd.empty((1024,), "float32", dev)
        module["addone"](a, b)
        np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
        result = module.time_evaluator("addone", dev, number=3, repeat=2)(a, b)
        assert len(result.results) == 2
    assert (tmp_path / "loaded").read_text().strip(), "the import blocker was not active in the server"


def test_upload_onto_a_directory_is_refused_and_nothing_is_left(session):
    session.upload(b"x", "dir/file")
    with pytest.raises(kernelrpc.RemoteError, match="IsADirectoryError"):
        session.upload(b"y" * 5000, "dir")
    assert session.listdir("dir") == ["file"]
    assert session.download("dir/file") == b"x"
