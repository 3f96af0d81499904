import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd
from kernelrpc.runtime import DTYPES, Tensor


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_array_round_trip_every_dtype(dtype):
    data = (np.arange(24).reshape(2, 3, 4) % 2 == 1) if dtype == "bool" else \
        (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    tensor = nd.array(data, kernelrpc.cpu(0))
    assert isinstance(tensor, Tensor)
    assert (tensor.shape, tensor.dtype) == ((2, 3, 4), dtype)
    assert tensor.data % 64 == 0
    np.testing.assert_array_equal(tensor.numpy(), data)


def test_array_from_non_contiguous_lists_and_tensors():
    data = np.arange(12, dtype="float32").reshape(3, 4)[:, ::2]
    np.testing.assert_array_equal(nd.array(data).numpy(), data)
    assert nd.array([[1, 2], [3, 4]]).dtype == "int64"
    assert nd.array([1.5]).dtype == "float64"
    copy = nd.array(nd.array(data))
    np.testing.assert_array_equal(copy.numpy(), data)


@pytest.mark.parametrize("dtype", ["float16", np.float16, np.dtype("float16")])
def test_empty_accepts_dtype_spellings(dtype):
    tensor = nd.empty((5, 0), dtype)
    assert (tensor.shape, tensor.dtype, tensor.nbytes) == ((5, 0), "float16", 0)


def test_empty_defaults_to_float32_on_the_local_cpu():
    tensor = nd.empty(3)
    assert (tensor.shape, tensor.dtype, tensor.device) == ((3,), "float32", kernelrpc.cpu(0))
    assert tensor.numpy().tolist() == [0.0, 0.0, 0.0]


def test_errors():
    with pytest.raises(TypeError, match="numpy dtype complex64 has no kernelrpc equivalent"):
        nd.array(np.zeros(2, "complex64"))
    with pytest.raises(TypeError, match="expected a kernelrpc Device"):
        nd.empty((2,), "float32", "cpu")
    with pytest.raises(ValueError, match="non-negative"):
        nd.empty((2, -1))
    with pytest.raises(TypeError, match="numpy dtype object has no kernelrpc equivalent; "
                                        "supported: bool, int8"):
        nd.array(np.array([object()]))
