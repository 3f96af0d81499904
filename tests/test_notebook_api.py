"""What a notebook user meets: dir() and reprs, LocalSession, the tracker's tables, queue-wait
progress, request_and_run and progress bars for large transfers, against real services."""
import numpy as np
import pytest

import kernelrpc
from conftest import wait_until
from kernelrpc import nd, rpc
from kernelrpc.rpc import client as rpc_client
from kernelrpc.rpc.tracker_summary import TrackerSummary
from notebook_helpers import request_behind


def test_dir_lists_the_lazily_loaded_names():
    for name in ("build", "cpu", "te", "rpc", "nd", "runtime", "display", "RPCError"):
        assert name in dir(kernelrpc)
    for name in ("connect", "connect_tracker", "LocalSession", "RPCSession", "TrackerSession"):
        assert name in dir(rpc)
        assert getattr(rpc, name) is not None


def test_local_session_has_the_remote_api(fixture_module):
    with rpc.LocalSession() as local:
        assert "LocalSession" in repr(local) and "workspace" in repr(local)
        local.upload(fixture_module, "kernels.so")
        local.upload(b"hello", "notes/a.txt")
        assert local.listdir() == ["kernels.so", "notes"]
        assert local.download("notes/a.txt") == bytearray(b"hello")
        module = local.load_module("kernels.so")
        dev = local.cpu(0)
        a = nd.array(np.arange(1024, dtype="float32"), dev)
        b = local.empty((1024,), "float32", dev)
        module["addone"](a, b)
        np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
        result = module.time_evaluator("addone", dev, number=3, repeat=2)(a, b)
        assert result.repeat == 2 and result.conditions is not None
        assert local.get_function("testing.echo")(7) == 7
        assert "testing.echo" in local.list_global_func_names()
        with pytest.raises(ValueError, match="outside|'..'"):
            local.upload(b"x", "../escape")
        local.remove("notes/a.txt")
        root = local.workspace.root
    assert not root.exists() and "closed" in repr(local)
    with pytest.raises(ValueError, match="closed"):
        local.listdir()


@pytest.fixture
def fleet(start_service):
    tracker = start_service("kernelrpc.tracker", ["--host", "127.0.0.1", "--port", "0"])
    server = start_service("kernelrpc.server", ["--host", "127.0.0.1", "--port", "0", "--key", "k",
                                                "--tracker", f"{tracker.host}:{tracker.port}"])
    server.wait_for_line("registered")
    return tracker, server


def test_tracker_summary_table_and_reprs(fleet, fixture_module):
    tracker, server = fleet
    with rpc.connect_tracker(tracker.host, tracker.port) as trk:
        assert repr(trk) == f"<TrackerSession {tracker.host}:{tracker.port} connected>"
        assert isinstance(trk.summary(), dict)       # still TVM's dict
        with trk.request("k", session_timeout=60) as remote:
            assert repr(remote).startswith(f"<RPCSession 127.0.0.1:{server.port} (kernelrpc pid ")
            assert "of 60 s left" in repr(remote)
            remote.upload(fixture_module, "kernels.so")
            module = remote.load_module("kernels.so")
            assert repr(module).startswith("<remote Module [") and "addone" in repr(module)
            assert f"on 127.0.0.1:{server.port}" in repr(module)
            client = "{}:{}".format(*trk._sock.getsockname()[:2])
            table = wait_until(lambda: (t := trk.summary_table()) and client in str(t) and t, timeout=30,
                               what="this client in the summary table")
            assert isinstance(table, TrackerSummary)
            text = str(table)
            assert f"127.0.0.1:{server.port}" in text and "held by" in text
            markup = table._repr_html_()
            assert "<table>" in markup and client in markup
        assert "closed" in repr(remote)
    assert "closed" in repr(trk)


def test_queue_wait_reports_position_and_holder(fleet, capsys):
    tracker, _ = fleet
    holder_trk = rpc.connect_tracker(tracker.host, tracker.port)
    holder = holder_trk.request("k")
    holder_client = "{}:{}".format(*holder_trk._sock.getsockname()[:2])
    waiter = rpc.connect_tracker(tracker.host, tracker.port)
    waiter.progress = True
    states, session = request_behind(holder, waiter, "k")
    assert session.get_function("testing.echo")(1) == 1
    session.close()
    state = states[0]
    assert (state.key, state.position, state.waiting, state.servers, state.free) == ("k", 1, 1, 1, 0)
    assert [h["client"] for h in state.holders] == [holder_client]
    assert str(state).startswith("position 1 of 1; 1 board, 0 free; held by " + holder_client)
    err = capsys.readouterr().err
    assert "waiting for 'k'" in err and "position 1 of 1" in err
    holder_trk.close()
    waiter.close()


def test_request_and_run_returns_retries_device_failures_and_raises_the_rest(fleet, fixture_module):
    tracker, _ = fleet
    trk = rpc.connect_tracker(tracker.host, tracker.port)
    attempts = []

    def crash_first(remote):
        attempts.append(remote.address)
        if len(attempts) == 1:
            remote.upload(fixture_module, "kernels.so")
            remote.load_module("kernels.so")["crash_segv"]()
        return remote.get_function("testing.echo")(42)

    assert trk.request_and_run("k", crash_first, max_retry=2) == 42
    assert len(attempts) == 2

    def wrong_call(remote):
        attempts.append(remote.address)
        remote.upload(fixture_module, "kernels.so")
        small = nd.empty((3,), "float32", remote.cpu(0))
        remote.load_module("kernels.so")["addone"](small, small)

    attempts.clear()
    with pytest.raises(kernelrpc.RemoteError):
        trk.request_and_run("k", wrong_call, max_retry=3)
    assert len(attempts) == 1

    def always_crash(remote):
        attempts.append(remote.address)
        remote.upload(fixture_module, "kernels.so")
        remote.load_module("kernels.so")["crash_segv"]()

    attempts.clear()
    with pytest.raises(kernelrpc.TrackerError, match="always_crash failed on key 'k' 2 times"):
        trk.request_and_run("k", always_crash, max_retry=2)
    assert len(attempts) == 2

    attempts.clear()
    with pytest.raises(kernelrpc.SessionTimeout):
        trk.request_and_run("k", lambda r: attempts.append(1) or r.get_function("testing.sleep")(60),
                            session_timeout=1, max_retry=3)
    assert attempts == [1]
    trk.close()


def test_large_transfers_and_tensor_copies_show_a_byte_progress_bar(start_service, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(rpc_client, "PROGRESS_MIN_BYTES", 1 << 20)
    server = start_service("kernelrpc.server", ["--host", "127.0.0.1", "--port", "0", "--key", "dev"])
    payload = np.random.default_rng(0).integers(0, 255, 9 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "big.bin"
    path.write_bytes(payload)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        sess.progress = True
        sess.upload(path)
        sess.upload(payload, "copy.bin")
        assert bytes(sess.download("big.bin")) == payload
        assert bytes(sess.download("copy.bin")) == payload
        tensor = nd.array(np.frombuffer(payload, np.uint8), sess.cpu(0))
        assert tensor.numpy().tobytes() == payload
        err = capsys.readouterr().err
        assert "upload big.bin" in err and "upload copy.bin" in err and "download big.bin" in err
        assert "copy to uint8[9437184]" in err and "copy from uint8[9437184]" in err
        assert "9.00M" in err
        sess.progress = False
        sess.upload(payload, "quiet.bin")
        assert bytes(sess.download("quiet.bin")) == payload
        assert capsys.readouterr().err == ""
        assert sess.get_function("testing.echo")("still in step") == "still in step"
