import socket
import threading

import numpy as np
import pytest

from kernelrpc import runtime
from kernelrpc.runtime import DTYPES, Device, Tensor, cpu


def sample(dtype: str, shape=(3, 5)) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_round_trip_every_dtype(dtype):
    data = sample(dtype)
    tensor = runtime.empty(data.shape, dtype).copyfrom(data)
    assert (tensor.shape, tensor.dtype, tensor.nbytes) == (data.shape, dtype, data.nbytes)
    out = tensor.numpy()
    assert out.dtype == data.dtype
    np.testing.assert_array_equal(out, data)
    assert bytes(tensor.buffer) == data.tobytes()


@pytest.mark.parametrize("nbytes", [0, 1, 3, 64, 1000, (1 << 20) + 3])
def test_data_is_64_byte_aligned_and_zeroed(nbytes):
    tensor = Tensor((nbytes,), "uint8")
    assert tensor.data % 64 == 0
    assert tensor.buffer.nbytes == nbytes
    assert not any(tensor.buffer[:4096])


def test_buffer_is_a_writable_view_of_the_data():
    tensor = Tensor((4,), "int32")
    tensor.buffer[4:8] = (7).to_bytes(4, "little")
    assert tensor.numpy().tolist() == [0, 7, 0, 0]
    assert tensor.buffer.readonly is False and tensor.buffer.format == "B"


def test_recv_into_streams_straight_into_the_tensor():
    payload = np.arange(1 << 18, dtype="float32")
    tensor = Tensor(payload.shape, "float32")
    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=left.sendall, args=(payload.tobytes(),))
        sender.start()
        view, got = tensor.buffer, 0
        while got < tensor.nbytes:
            n = right.recv_into(view[got:])
            assert n, f"closed after {got} of {tensor.nbytes} bytes"
            got += n
        sender.join()
    np.testing.assert_array_equal(tensor.numpy(), payload)


def test_copyfrom_converts_ndarray_dtype_and_layout():
    tensor = Tensor((3, 2), "float32")
    tensor.copyfrom(np.arange(6, dtype="int64").reshape(2, 3).T)  # int64, not C-contiguous
    np.testing.assert_array_equal(tensor.numpy(), np.arange(6).reshape(2, 3).T)
    tensor.copyfrom([[1, 2], [3, 4], [5, 6]])
    assert tensor.numpy().tolist() == [[1, 2], [3, 4], [5, 6]]


def test_copyfrom_buffers_and_tensors():
    tensor = Tensor((2, 2), "int16")
    tensor.copyfrom(np.array([1, 2, 3, 4], dtype="int16").tobytes())
    assert tensor.numpy().tolist() == [[1, 2], [3, 4]]
    tensor.copyfrom(memoryview(np.array([[5, 6], [7, 8]], dtype="int16")))
    assert tensor.numpy().tolist() == [[5, 6], [7, 8]]
    other = Tensor((2, 2), "int16").copyfrom(tensor)
    assert other.numpy().tolist() == [[5, 6], [7, 8]]
    assert np.asarray(other).tolist() == [[5, 6], [7, 8]]


def test_copyfrom_errors_say_what_does_not_match():
    tensor = Tensor((2, 3), "float32")
    with pytest.raises(ValueError, match=r"array shape \(3, 2\) does not match tensor shape \(2, 3\)"):
        tensor.copyfrom(np.zeros((3, 2), "float32"))
    with pytest.raises(ValueError, match="source has 4 bytes, this tensor float32\\[2, 3\\] has 24"):
        tensor.copyfrom(b"abcd")
    with pytest.raises(ValueError, match="float32\\[2, 3\\]"):
        tensor.copyfrom(Tensor((2, 3), "int32"))
    with pytest.raises(TypeError, match="expected an ndarray, a Tensor or a buffer, got int"):
        tensor.copyfrom(3)
    with pytest.raises(ValueError, match="C-contiguous"):
        tensor.copyfrom(memoryview(bytes(48))[::2])


def test_copyto_tensor_and_device():
    source = Tensor((5,), "uint16").copyfrom(np.arange(5, dtype="uint16"))
    copy = source.copyto(cpu(0))
    assert copy is not source and copy.numpy().tolist() == [0, 1, 2, 3, 4]
    target = Tensor((5,), "uint16")
    assert source.copyto(target) is target
    assert target.numpy().tolist() == [0, 1, 2, 3, 4]


def test_free_releases_and_later_use_is_an_error():
    tensor = Tensor((1 << 20,), "uint8")
    tensor.free()
    assert tensor.freed
    with pytest.raises(ValueError, match="freed"):
        tensor.data
    with pytest.raises(ValueError, match="freed"):
        tensor.numpy()
    tensor.free()


def test_a_view_outlives_free_safely():
    tensor = Tensor((8,), "uint8").copyfrom(bytes(range(8)))
    view = tensor.buffer
    tensor.free()
    assert bytes(view) == bytes(range(8))


def test_shape_and_dtype_validation():
    with pytest.raises(ValueError, match="non-negative"):
        Tensor((2, -3))
    with pytest.raises(TypeError, match="unsupported dtype 'complex64'"):
        Tensor((2,), "complex64")
    with pytest.raises(ValueError, match="local device"):
        Tensor((2,), "float32", Device("cpu", 0, session=object()))


def test_empty_tensor_and_scalar_shape():
    empty = Tensor((0, 4), "float64")
    assert empty.nbytes == 0 and empty.numpy().shape == (0, 4)
    scalar = Tensor((), "int64").copyfrom(np.array(42))
    assert scalar.numpy() == 42 and scalar.ndim == 0


def test_devices():
    assert runtime.cpu(1) == runtime.device("cpu", 1) == runtime.device("llvm -mcpu=znver4", 1)
    assert runtime.device(1).device_type_code == 1
    assert repr(cpu(0)) == "cpu(0)"
    assert cpu(0) != Device("cpu", 0, session=object())
    with pytest.raises(ValueError, match="unsupported device type 'cuda'"):
        runtime.device("cuda")
    with pytest.raises(ValueError, match="device_id"):
        runtime.cpu(-1)
