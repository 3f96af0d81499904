"""ScatterElements and ScatterND against onnxruntime, indices computed at run time (negative
ones too), every reduction in the opsets that define it; an index out of range at run time
stops the run with a KernelError."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_check import N, NEWEST_OPSET, build, check_graph, graph_model, rand, run  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.errors import KernelError  # noqa: E402

RNG = np.random.default_rng(23)

#: the opsets where each reduction exists, the first and the newest
REDUCTIONS = [("none", 11), ("none", 13), ("add", 16), ("mul", 16), ("max", 18), ("min", 18),
              ("none", NEWEST_OPSET), ("add", NEWEST_OPSET)]


def _distinct(count, size):
    """``count`` distinct positions of ``size`` (a reduction of none keeps the last of
    repeated ones, which ONNX leaves undefined), half of them negative."""
    picked = RNG.permutation(size)[:count]
    return np.where(RNG.integers(0, 2, count) == 1, picked - size, picked)


@pytest.mark.parametrize("reduction,opset", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, opset, axis):
    data = rand(RNG, 4, 5, 3)
    shape = [3, 2, 3]
    dim = data.shape[axis]
    ids = np.zeros(shape, np.int64)
    for q in np.ndindex(*[s for k, s in enumerate(shape) if k != axis % 3]):
        line = list(q)
        line.insert(axis % 3, slice(None))
        ids[tuple(line)] = _distinct(shape[axis], dim) if reduction == "none" else \
            RNG.integers(-dim, dim, shape[axis])
    attrs = {} if opset < 16 else {"reduction": reduction}
    check_graph([N("ScatterElements", ["data", "ids", "upd"], ["y"], axis=axis, **attrs)],
          {"data": data, "ids": ids, "upd": rand(RNG, *shape)}, opset=opset)


@pytest.mark.parametrize("reduction,opset", REDUCTIONS)
@pytest.mark.parametrize("data,ids", [((4, 5, 3), (2, 2)), ((4, 5, 3), (2, 2, 1)),
                                      ((4, 5), (3, 2))])
def test_scatter_nd(reduction, opset, data, ids):
    x = rand(RNG, *data)
    depth, count = ids[-1], int(np.prod(ids[:-1]))
    dims = data[:depth]
    flat = _distinct(count, int(np.prod(dims))) % int(np.prod(dims)) if reduction == "none" \
        else RNG.integers(0, int(np.prod(dims)), count)
    index = np.stack(np.unravel_index(flat, dims), axis=-1).reshape(ids)
    index = np.where(RNG.integers(0, 2, ids) == 1, index - np.asarray(dims), index)
    attrs = {} if opset < 16 else {"reduction": reduction}
    upd = rand(RNG, *ids[:-1], *data[depth:])
    check_graph([N("ScatterND", ["x", "ids", "upd"], ["y"], **attrs)],
          {"x": x, "ids": index.astype(np.int64), "upd": upd}, opset=opset)


def test_scatter_of_an_index_out_of_range_is_a_run_time_error():
    model = graph_model([N("ScatterElements", ["data", "ids", "upd"], ["a"], axis=1),
                      N("ScatterND", ["data", "nd", "row"], ["b"])],
                     {"data": rand(RNG, 3, 4), "ids": ((3, 1), np.int64), "upd": rand(RNG, 3, 1),
                      "nd": ((1, 1), np.int64), "row": rand(RNG, 1, 4)}, ["a", "b"])
    module = build(model)
    ok = {"data": rand(RNG, 3, 4), "ids": np.zeros((3, 1), np.int64), "upd": rand(RNG, 3, 1),
          "nd": np.array([[-3]]), "row": rand(RNG, 1, 4)}
    run(module, ok)
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {**ok, "ids": np.array([[0], [4], [1]], np.int64)})
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {**ok, "nd": np.array([[3]], np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatters_of_constants_fold(reduction):
    """All inputs known at import: evaluated there (numpy), only the Add remains."""
    nodes = [N("ScatterND", ["c", "nd", "row"], ["s"], reduction=reduction),
             N("ScatterElements", ["s", "ids", "upd"], ["t"], axis=1, reduction=reduction),
             N("Add", ["x", "t"], ["y"])]
    inits = {"c": rand(RNG, 3, 4), "nd": np.array([[2], [-3]], np.int64), "row": rand(RNG, 2, 4),
             "ids": np.array([[3], [-1], [0]], np.int64), "upd": rand(RNG, 3, 1)}
    check_graph(nodes, {"x": rand(RNG, 3, 4)}, inits=inits, opset=18)
    mod, _ = relay.frontend.from_onnx(graph_model(nodes, {"x": rand(RNG, 3, 4)}, ["y"], inits, 18))
    assert {n.op for n in mod["main"].topo()} - {"input", "param", "const"} == {"add"}
