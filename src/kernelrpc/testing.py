"""TVM's ``tvm.testing`` helpers that user code and tutorials call."""
from __future__ import annotations

import numpy as np

__all__ = ["assert_allclose"]


def assert_allclose(actual, desired, rtol: float = 1e-7, atol: float = 1e-7,
                    verbose: bool = True) -> None:
    """``numpy.testing.assert_allclose`` with TVM's defaults, on arrays or ``nd`` tensors.

    Unlike numpy's, the shapes must match exactly (no broadcasting), as in TVM.
    """
    actual, desired = _as_numpy(actual), _as_numpy(desired)
    np.testing.assert_equal(actual.shape, desired.shape, err_msg="shapes differ")
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, verbose=verbose)


def _as_numpy(value) -> np.ndarray:
    return np.asanyarray(value.numpy() if hasattr(value, "numpy") else value)
