"""Symbolic shapes: ``n = te.var("n")`` as an extent builds one module that runs at several
sizes; the metadata names the shape variable, the runtime binds it from the tensors and
refuses inconsistent shapes; the exported library round-trips."""
from __future__ import annotations

import json

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, runtime, te
from kernelrpc.errors import ModuleError
from kernelrpc.runtime.metadata import parse_metadata


def _vector_add():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    outer, inner = s[C].split(C.op.axis[0], factor=16)
    s[C].parallel(outer)
    s[C].vectorize(inner)
    return s, [A, B, C]


@pytest.fixture(scope="module")
def module():
    s, args = _vector_add()
    return kernelrpc.build(s, args, name="myadd")


def test_metadata_records_the_shape_variable(module):
    (func,) = module.metadata["functions"]
    assert [a.get("shape") for a in func["args"]] == [["n"], ["n"], ["n"], None]
    assert func["args"][3] == {"name": "n", "kind": "scalar", "dtype": "int32"}


@pytest.mark.parametrize("size", [1, 15, 16, 1000, 1024])
def test_one_module_runs_at_several_sizes(module, size):
    dev = kernelrpc.cpu(0)
    rng = np.random.default_rng(size)
    a = rng.random(size, dtype=np.float32)
    b = rng.random(size, dtype=np.float32)
    c = nd.empty((size,), "float32", dev)
    module(nd.array(a, dev), nd.array(b, dev), c)            # n bound from the shapes
    np.testing.assert_allclose(c.numpy(), a + b)
    c2 = nd.empty((size,), "float32", dev)
    module(nd.array(a, dev), nd.array(b, dev), c2, size)     # or given, and checked
    np.testing.assert_allclose(c2.numpy(), a + b)


def test_time_evaluator_and_shape_errors(module):
    dev = kernelrpc.cpu(0)
    a, b, c = (nd.array(np.ones(64, "float32"), dev) for _ in range(3))
    result = module.time_evaluator(module.entry_name, dev, number=3)(a, b, c)
    assert result.mean > 0
    np.testing.assert_allclose(c.numpy(), 2.0)
    with pytest.raises(ValueError, match="dimension 0 is 3, but n = 64"):
        module(a, b, nd.empty((3,), "float32", dev))
    with pytest.raises(ValueError, match="is 5, but the tensors' shapes say 64"):
        module(a, b, c, 5)


def test_exported_library_round_trip(module, tmp_path):
    path = module.export_library(tmp_path / "myadd.so")
    loaded = runtime.load_module(str(path))
    dev = kernelrpc.cpu(0)
    a = nd.array(np.arange(37, dtype="float32"), dev)
    c = nd.empty((37,), "float32", dev)
    loaded["myadd"](a, a, c)
    np.testing.assert_allclose(c.numpy(), 2 * np.arange(37))


def test_metadata_refuses_an_unknown_shape_variable():
    doc = {"format": "kernelrpc.module", "version": 1, "entry": "f",
           "functions": [{"name": "f", "symbol": "__kernelrpc_fn_f", "args": [
               {"name": "A", "kind": "tensor", "dtype": "float32", "shape": ["m"]},
               {"name": "n", "kind": "scalar", "dtype": "int32"}]}]}
    with pytest.raises(ModuleError, match="shape variable 'm'"):
        parse_metadata(json.dumps(doc))
    doc["functions"][0]["args"][0]["shape"] = ["n"]
    assert parse_metadata(json.dumps(doc)).functions["f"].shape_vars == (1,)


def test_a_shape_expression_is_refused_with_a_clear_error():
    n = te.var("n")
    A = te.placeholder((n * 2,), name="A")
    B = te.compute(A.shape, lambda i: A[i] + 1.0, name="B")
    with pytest.raises(Exception, match="must be a constant or a te.var"):
        kernelrpc.build(te.create_schedule(B.op), [A, B])


@pytest.fixture
def remote_session(start_service):
    from kernelrpc import rpc
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])
    with rpc.connect(server.host, server.port, key="dev") as sess:
        yield sess


def test_symbolic_module_on_a_remote_device(remote_session, module, tmp_path):
    """The device binds the shape variable too (a real server process)."""
    remote_session.upload(module.export_library(tmp_path / "myadd.so"), "myadd.so")
    remote = remote_session.load_module("myadd.so")
    dev = remote_session.cpu(0)
    for size in (5, 300):
        x = np.arange(size, dtype="float32")
        a, c = nd.array(x, dev), nd.empty((size,), "float32", dev)
        remote["myadd"](a, a, c)
        np.testing.assert_allclose(c.numpy(), 2 * x)
    result = remote.time_evaluator("myadd", dev, number=3)(a, a, c)
    assert result.mean > 0
    with pytest.raises(kernelrpc.RemoteError, match="dimension 0 is 4"):
        remote["myadd"](a, a, nd.empty((4,), "float32", dev))
