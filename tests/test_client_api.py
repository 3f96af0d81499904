"""Client behaviour: errors, lifetimes, remote objects mirroring the runtime API."""
import gc
import os
import signal
import socket

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.runtime import Tensor as LocalTensor


@pytest.fixture
def server(start_service):
    """A server without a key whose tensors are limited to 1 MB (test_client_requests uses it too)."""
    return start_service("kernelrpc.server", ["--port", "0", "--max-tensor-bytes", "1000000"])


@pytest.fixture
def session(server):
    with rpc.connect(server.host, server.port) as sess:
        yield sess


@pytest.fixture
def kernels(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


def test_connect_to_a_closed_port_is_connection_lost():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(kernelrpc.ConnectionLost, match="cannot connect"):
        rpc.connect("127.0.0.1", port)


def test_server_killed_mid_session_is_connection_lost(server):
    sess = rpc.connect(server.host, server.port)
    server.stop(signal.SIGKILL)
    with pytest.raises(kernelrpc.ConnectionLost):
        sess.get_function("testing.echo")(1)
    assert sess.closed


def test_server_shutdown_mid_session_is_connection_lost(server):
    sess = rpc.connect(server.host, server.port)
    os.kill(server.proc.pid, signal.SIGTERM)
    server.proc.wait(10)
    with pytest.raises(kernelrpc.ConnectionLost, match="shutting down"):
        sess.get_function("testing.echo")(1)


def test_close_is_idempotent_and_later_use_is_a_clear_error(server):
    sess = rpc.connect(server.host, server.port)
    sess.close()
    sess.close()
    with pytest.raises(kernelrpc.ConnectionLost, match="closed"):
        sess.listdir()


def test_missing_global_function_is_a_remote_lookup_error(session):
    with pytest.raises(kernelrpc.RemoteError) as info:
        session.get_function("no.such.function")
    assert info.value.type_name == "LookupError" and "testing.echo" in info.value.remote_message
    assert "testing.echo" in session.list_global_func_names()


def test_remote_objects_freed_by_the_garbage_collector(session):
    live = session.get_function("session.live_handles")
    dev = session.cpu(0)
    before = live()
    tensors = [nd.empty((16,), "float32", dev) for _ in range(10)]
    assert live() == before + 10
    del tensors
    gc.collect()
    assert live() == before  # the frees went out together with this call


def test_calling_a_freed_function_is_a_remote_error_and_the_session_goes_on(session):

    echo = session.get_function("testing.echo")
    session.channel.free(echo._handle)
    with pytest.raises(kernelrpc.RemoteError, match="freed") as info:
        echo(1)
    assert info.value.type_name == "LookupError"
    assert session.get_function("testing.echo")(2) == 2


def test_tensor_limits_and_layout_errors(session):
    with pytest.raises(kernelrpc.RemoteError, match="max_tensor_bytes"):
        nd.empty((1_000_001,), "uint8", session.cpu(0))
    with pytest.raises(TypeError, match="dtype"):
        nd.empty((4,), "complex64", session.cpu(0))
    remote = nd.empty((4,), "float32", session.cpu(0))
    with pytest.raises(ValueError, match="shape"):
        remote.copyfrom(np.zeros(5, "float32"))


def test_copies_between_local_and_remote_tensors(session):
    dev = session.cpu(0)
    local = LocalTensor((6,), "int32").copyfrom(np.arange(6, dtype="int32"))
    remote = nd.empty((6,), "int32", dev)
    remote.copyfrom(local)
    back = remote.copyto(kernelrpc.cpu(0))
    np.testing.assert_array_equal(back.numpy(), np.arange(6))
    other = remote.copyto(dev)
    np.testing.assert_array_equal(other.numpy(), np.arange(6))
    target = np.zeros(6, "int32")
    remote.copyto(target)
    np.testing.assert_array_equal(target, np.arange(6))
    np.testing.assert_array_equal(session.get_function("testing.echo")(local).numpy(), np.arange(6))


def test_time_evaluator_follows_tvm_call_counts(session, kernels):
    dev = session.cpu(0)
    a = nd.array(np.ones(16, "float32"), dev)
    b = nd.empty(a.shape, "float32", dev)
    counts = nd.empty((2,), "int64", dev)
    kernels["counter_reset"]()
    result = kernels.time_evaluator("counted", dev, number=2, repeat=3)(a, b)
    kernels["counter_read"](counts)
    assert counts.numpy()[0] == 1 + 2 * 3  # one warm-up call, then number x repeat
    assert result.number == 2 and len(result.results) == 3
    assert result.target == kernels.metadata["target"]


def test_kernel_error_code_is_a_remote_error(session, kernels):
    with pytest.raises(kernelrpc.RemoteError) as info:
        kernels["error_code"](7)
    assert "7" in info.value.remote_message


def test_refused_copy_keeps_the_stream_in_step(session):

    tensor = nd.empty((1000,), "float32", session.cpu(0))
    session.channel.free(tensor._handle)
    with pytest.raises(kernelrpc.RemoteError, match="freed"):
        tensor.copyfrom(np.ones(1000, "float32"))  # 4000 raw bytes follow the refused request
    assert session.get_function("testing.echo")("in step") == "in step"


def test_cache_flush_preprocessor_runs_once_per_repeat(session, kernels):
    dev = session.cpu(0)
    a = nd.array(np.ones(16, "float32"), dev)
    b = nd.empty((16,), "float32", dev)
    counts = nd.empty((2,), "int64", dev)
    kernels["counter_reset"]()
    kernels.time_evaluator("counted", dev, number=1, repeat=4,
                           f_preproc="cache_flush_cpu_non_first_arg")(a, b)
    kernels["counter_read"](counts)
    assert counts.numpy()[1] == 4  # one flush of the non-first tensor argument per repeat


def test_remote_objects_mirror_the_runtime_api(session, kernels, fixture_module):
    from kernelrpc.runtime import load_module

    local = load_module(fixture_module)
    assert kernels.function_names == local.function_names
    assert kernels.target == local.target and kernels.entry_name == local.entry_name
    assert "addone" in kernels and "nope" not in kernels
    live = session.get_function("session.live_handles")
    before = live()
    tensor = nd.empty((8,), "float32", session.cpu(0))
    assert live() == before + 1
    tensor.free()
    assert tensor.freed and live() == before
    with pytest.raises(ValueError, match="freed"):
        tensor.numpy()


def test_time_evaluator_accepts_fractional_ms_and_tvm_keywords(session, kernels):
    dev = session.cpu(0)
    a = nd.array(np.ones(16, "float32"), dev)
    b = nd.empty((16,), "float32", dev)
    timer = kernels.time_evaluator("counted", dev, number=1, repeat=2, min_repeat_ms=0.5,
                                   limit_zero_time_iterations=10, cache_flush_bytes=1 << 16)
    result = timer(a, b)
    assert len(result.results) == 2 and result.number >= 1
