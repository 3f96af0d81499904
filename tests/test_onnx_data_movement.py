"""The data-movement operators against onnxruntime, with run-time data of odd shapes and every
attribute form, in the opsets that define each: Expand, Tile, Range, Trilu, GatherElements,
GatherND, DepthToSpace, SpaceToDepth, CastLike, Pad (run-time value, negative pads)."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_check import N, NEWEST_OPSET, build, check_graph, graph_model, rand, run  # noqa: E402

from kernelrpc.errors import KernelError  # noqa: E402

RNG = np.random.default_rng(17)


def i64(*values):
    return np.asarray(values, np.int64)


@pytest.mark.parametrize("opset", [9, 13, NEWEST_OPSET])
@pytest.mark.parametrize("x,shape", [((3, 1), (2, 3, 5)), ((1, 4, 1), (3, 1, 1)),
                                     ((2, 3), (1, 1)), ((5,), (5,))])
def test_expand_and_tile(opset, x, shape):
    """Expand broadcasts both ways (a target smaller than the input keeps the input's);
    Tile of the result by a constant count per axis."""
    reps = i64(*([2, 1, 3][-len(np.broadcast_shapes(x, shape)):]))
    check_graph([N("Expand", ["x", "shape"], ["e"]), N("Tile", ["e", "reps"], ["y"])],
                {"x": rand(RNG, *x)},
          ["e", "y"], inits={"shape": i64(*shape), "reps": reps}, opset=opset)


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 7, 1, np.int64), (10, -3, -3, np.int32), (0.5, 2.25, 0.25, np.float32),
    (3, 3, 1, np.int64)])
def test_range_of_constants_feeds_the_network(start, limit, delta, dtype):
    """Range's output (empty too) concatenated to a run-time tensor, at opset 11 and newest."""
    x = (RNG.integers(-5, 5, (4,)) if np.dtype(dtype).kind == "i" else rand(RNG, 4)).astype(dtype)
    for opset in (11, NEWEST_OPSET):
        check_graph([N("Range", ["s", "l", "d"], ["r"]), N("Concat", ["x", "r"], ["y"], axis=0)],
              {"x": x}, inits={n: np.asarray(v, dtype) for n, v in
                               (("s", start), ("l", limit), ("d", delta))}, opset=opset)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7, 9])
def test_trilu(upper, k):
    inits = {} if k is None else {"k": i64(k).reshape(())}
    check_graph([N("Trilu", ["x"] + (["k"] if k is not None else []), ["y"], upper=upper)],
          {"x": rand(RNG, 2, 4, 6)}, inits=inits, opset=14)


@pytest.mark.parametrize("opset", [11, 13, NEWEST_OPSET])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_with_run_time_indices(opset, axis):
    data = rand(RNG, 4, 5, 3)
    shape = [3, 4, 2]
    dim = data.shape[axis]
    shape[axis] = 6
    ids = RNG.integers(-dim, dim, shape).astype(np.int64)
    check_graph([N("GatherElements", ["data", "ids"], ["y"], axis=axis)],
                {"data": data, "ids": ids},
          opset=opset)


@pytest.mark.parametrize("opset", [12, NEWEST_OPSET])
@pytest.mark.parametrize("data,ids,batch_dims", [((4, 5, 3), (2, 2), 0), ((4, 5, 3), (2, 3, 1), 0),
                                                 ((4, 5, 3), (3,), 0), ((2, 5, 3), (2, 4, 1), 1),
                                                 ((2, 3, 4, 5), (2, 3, 2), 2)])
def test_gather_nd_with_run_time_indices(opset, data, ids, batch_dims):
    x = rand(RNG, *data)
    dims = np.asarray(data[batch_dims:batch_dims + ids[-1]])
    index = (RNG.integers(0, 1 << 30, ids) % dims - RNG.integers(0, 2, ids) * dims).astype(np.int64)
    check_graph([N("GatherND", ["x", "ids"], ["y"], batch_dims=batch_dims)], {"x": x, "ids": index},
          opset=opset)


def test_gather_elements_and_nd_refuse_an_index_out_of_range_at_run_time():
    model = graph_model([N("GatherElements", ["data", "ids"], ["a"], axis=1),
                      N("GatherND", ["data", "nd"], ["b"])],
                     {"data": rand(RNG, 3, 4), "ids": ((3, 2), np.int64), "nd": ((2, 2), np.int64)},
                     ["a", "b"])
    module = build(model)
    data = rand(RNG, 3, 4)
    ok = {"data": data, "ids": np.zeros((3, 2), np.int64), "nd": i64([0, 3], [2, -4])}
    run(module, ok)
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {**ok, "ids": np.full((3, 2), 4, np.int64)})
    with pytest.raises(KernelError, match="out of bounds"):
        run(module, {**ok, "nd": i64([0, 0], [0, 4])})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode):
    nodes = [N("DepthToSpace", ["x"], ["d"], blocksize=2, mode=mode),
             N("SpaceToDepth", ["d"], ["s"], blocksize=2)]
    check_graph(nodes, {"x": rand(RNG, 2, 12, 3, 5)}, ["d", "s"], opset=13)
    nodes[1] = N("SpaceToDepth", ["d"], ["s"], blocksize=2, mode=mode)
    check_graph(nodes, {"x": rand(RNG, 2, 12, 3, 5)}, ["d", "s"], opset=NEWEST_OPSET)
    check_graph([N("DepthToSpace", ["x"], ["y"], blocksize=3)], {"x": rand(RNG, 1, 18, 2, 3)},
                opset=9)


@pytest.mark.parametrize("like", [np.int32, np.float64, np.bool_])
def test_cast_like(like):
    x = np.asarray(RNG.integers(-3, 4, (3, 5)), np.float32) * 0.5
    for opset in (15, NEWEST_OPSET):
        check_graph([N("CastLike", ["x", "like"], ["y"])], {"x": x},
                    inits={"like": np.zeros(1, like)},
              opset=opset)


@pytest.mark.parametrize("pads", [[1, 0, 2, 3], [0, -1, 1, -2], [-1, 2, 0, 1]])
@pytest.mark.parametrize("value_at_run_time", [False, True])
def test_pad_crops_and_takes_its_value_at_run_time(pads, value_at_run_time):
    """Negative pads crop; the constant value may be an input (its shape is static)."""
    inputs = {"x": rand(RNG, 3, 5)}
    inits = {"pads": i64(*pads)}
    if value_at_run_time:
        inputs["v"] = np.asarray(2.5, np.float32)
    else:
        inits["v"] = np.asarray(-1.5, np.float32)
    check_graph([N("Pad", ["x", "pads", "v"], ["y"])], inputs, inits=inits, opset=13)
