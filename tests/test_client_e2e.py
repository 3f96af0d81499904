"""End to end over a real server process: connect, global functions, tensors, modules, timing."""
import asyncio

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.runtime import ProfileResult


def test_echo_round_trips_every_argument_type(session):
    echo = session.get_function("testing.echo")
    for value in (0, -(1 << 63), 2.5, "text ü", b"\x00bytes", None, True, [1, [2.0, "x"]]):
        assert echo(value) == value
    dev = echo(session.cpu(0))
    assert dev.device_type == "cpu" and dev.session is session


def test_numpy_scalars_travel_as_python_scalars(session):
    import numpy as np

    echo = session.get_function("testing.echo")
    for value in (np.int64(-5), np.int32(7), np.float32(0.5), np.float64(2.25), np.bool_(True)):
        result = echo(value)
        assert type(result) is type(value.item()) and result == value.item()
    assert echo(np.zeros((2, 2), "float32")).shape == (2, 2)  # arrays still become tensors


def test_scalar_calls_take_the_fast_path_with_edge_values(session):
    echo = session.get_function("testing.echo")
    for value in (2**63 - 1, -2**63, -0.0, float("inf"), 5e-324, True, False):
        assert repr(echo(value)) == repr(value)
    assert echo() == [] and echo(1, 2.5, -3) == [1, 2.5, -3] and echo(*range(7)) == list(range(7))
    with pytest.raises(kernelrpc.ProtocolError, match="64 bits"):
        echo(2**63)
    assert echo(7) == 7  # the session goes on


def test_calls_and_results_longer_than_one_small_read(session):
    echo = session.get_function("testing.echo")
    text = "long " * 50_000
    assert echo(text) == text
    assert echo(*range(100)) == list(range(100))
    tensors = [session.empty((2, 3), "float32") for _ in range(12)]
    assert [t.shape for t in echo(*tensors)] == [(2, 3)] * 12


def test_tensor_round_trip_keeps_bytes_exactly(session):
    source = np.random.default_rng(0).standard_normal((3, 5, 7)).astype("float32")
    remote = nd.array(source, session.cpu(0))
    assert remote.shape == (3, 5, 7) and remote.dtype == "float32"
    np.testing.assert_array_equal(remote.numpy(), source)
    remote.copyfrom(source * 2)
    np.testing.assert_array_equal(remote.numpy(), source * 2)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "float16", "float64", "bool"])
def test_tensor_dtypes(session, dtype):
    source = (np.arange(37) % 2).astype(dtype)
    np.testing.assert_array_equal(nd.array(source, session.cpu(0)).numpy(), source)


def test_empty_and_zero_sized_tensors(session):
    assert not nd.empty((4, 4), "int32", session.cpu(0)).numpy().any()
    assert nd.array(np.zeros((0, 3), "float32"), session.cpu(0)).numpy().shape == (0, 3)


def test_upload_load_call_and_time(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    module = session.load_module("kernels.so")
    assert module.metadata["format"] == "kernelrpc.module"
    dev = session.cpu(0)
    a = nd.array(np.arange(1024, dtype="float32"), dev)
    b = nd.empty((1024,), "float32", dev)
    module["addone"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
    result = module.time_evaluator("addone", dev, number=5, repeat=3)(a, b)
    assert isinstance(result, ProfileResult)
    assert len(result.results) == 3 and result.min <= result.median <= result.max


def test_wrong_call_is_a_remote_error_and_session_survives(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    module = session.load_module("kernels.so")
    small = nd.empty((10,), "float32", session.cpu(0))
    with pytest.raises(kernelrpc.RemoteError) as info:
        module["addone"](small, small)
    assert "1024" in str(info.value) and info.value.traceback_text
    assert session.get_function("testing.echo")(7) == 7


def test_kernel_calls_check_every_tensor_each_time(session, fixture_module):
    """The same handles again and again (the decoder's memo), then a wrong or freed tensor."""
    from kernelrpc.rpc.remote import Tensor as RemoteTensor

    session.upload(fixture_module, "kernels.so")
    addone = session.load_module("kernels.so")["addone"]
    dev = session.cpu(0)
    a = nd.array(np.arange(1024, dtype="float32"), dev)
    b = nd.empty((1024,), "float32", dev)
    for _ in range(3):
        addone(a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)
    wrong_dtype, wrong_shape = nd.empty((1024,), "int32", dev), nd.empty((1023,), "float32", dev)
    for bad, message in ((wrong_dtype, "dtype float32, got int32"), (wrong_shape, "shape")):
        with pytest.raises(kernelrpc.RemoteError, match=message):
            addone(a, bad)
    gone = nd.empty((1024,), "float32", dev)
    stale = RemoteTensor(session, gone._handle, dev)  # the same handle, sent after the free
    for _ in range(2):                                # prepared on the server from the second call
        addone(a, gone)
    gone.free()
    with pytest.raises(kernelrpc.RemoteError, match="freed already"):
        addone(a, stale)
    addone(b, a)
    np.testing.assert_array_equal(a.numpy(), np.arange(1024, dtype="float32") + 2)


def test_sync_api_works_inside_a_running_event_loop(server):
    async def notebook_cell():
        with rpc.connect(server.host, server.port, key="dev") as sess:
            return sess.get_function("testing.echo")("from a loop")

    assert asyncio.run(notebook_cell()) == "from a loop"
