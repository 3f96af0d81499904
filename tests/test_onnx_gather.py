"""Gather against onnxruntime: constant indices of every rank (a 0-d index after an operator,
class-token pooling, once failed at build), indices computed at run time (an embedding
lookup), negative indices; an index out of range at run time stops the run with a KernelError
and never reads outside the table."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_check import N, NEWEST_OPSET, build, check_graph, graph_model, rand, run  # noqa: E402

from kernelrpc.errors import KernelError  # noqa: E402

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("index", [np.array(0), np.array(-1), np.array([2]),
                                   np.array([[0, 3], [4, 0]])],
                         ids=["0d", "0d-negative", "1-element", "2x2"])
def test_constant_index_after_an_operator(index):
    """Relu then Gather(axis=1) on 1x5x8: ``x[:, 0]`` is the class-token pooling of BERT/ViT."""
    check_graph([N("Relu", ["x"], ["r"]), N("Gather", ["r", "i"], ["y"], axis=1)],
                {"x": rand(RNG, 1, 5, 8)},
          inits={"i": index.astype(np.int64)})


@pytest.mark.parametrize("opset", [9, 13, NEWEST_OPSET])
@pytest.mark.parametrize("axis,ids_shape", [(0, (2, 7)), (0, ()), (1, (3,)), (-1, (2, 2))])
def test_run_time_indices(opset, axis, ids_shape):
    """An embedding table (initializer) indexed by an input, negative indices included."""
    table = rand(RNG, 11, 6, 5)
    dim = table.shape[axis]
    ids = RNG.integers(-dim, dim, ids_shape).astype(np.int64)
    check_graph([N("Gather", ["table", "ids"], ["y"], axis=axis)], {"ids": ids},
                inits={"table": table},
          opset=opset)


def test_run_time_int32_indices_into_a_computed_tensor():
    x, ids = rand(RNG, 4, 9), np.array([[8, 0, -9]], np.int32)
    check_graph([N("Tanh", ["x"], ["t"]), N("Gather", ["t", "ids"], ["y"], axis=1)],
                {"x": x, "ids": ids})


@pytest.mark.parametrize("bad", [11, -12, 2**32 + 1, -(2**40)])
def test_an_index_out_of_range_is_a_run_time_error(bad):
    """The row past the end (which is still inside the buffer for every row but the last),
    and int64 values that int32 arithmetic would wrap into the table."""
    table = rand(RNG, 11, 6)
    model = graph_model([N("Gather", ["table", "ids"], ["y"])], {"ids": ((3,), np.int64)}, ["y"],
                     {"table": table})
    module = build(model)
    ok = np.array([0, 10, -11], np.int64)
    np.testing.assert_array_equal(run(module, {"ids": ok})[0], table[ok])
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {"ids": np.array([0, bad, 3], np.int64)})
    np.testing.assert_array_equal(run(module, {"ids": ok})[0], table[ok])
