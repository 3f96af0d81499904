"""Whole networks: built on the host, run through the graph executor here, in a LocalSession
and on a real device server through a real tracker, each output checked against onnxruntime.
The per-layer profile, set_input's checks and the exported module's contents too."""
import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import kernelrpc  # noqa: E402
from kernelrpc import relay, rpc  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.contrib.debugger import debug_executor  # noqa: E402
from kernelrpc.errors import GraphInputError  # noqa: E402
from kernelrpc.relay.testing import (light_model, light_names, mobilenet_v2, model_input,  # noqa: E402
                       onnxruntime_outputs, resnet18, set_batch)
from servicectl import start_server  # noqa: E402

TOLERANCE = 1e-3      # of the output's scale


def check(model, lib_or_module, dev=None, feeds=None):
    feeds = feeds or model_input(model)
    m = graph_executor.GraphModule(lib_or_module["default"](dev or kernelrpc.cpu(0)))
    m.set_input(**feeds)
    m.run()
    for k, ref in enumerate(onnxruntime_outputs(model, feeds)):
        got = m.get_output(k).numpy()
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOLERANCE * np.abs(ref).max())
    return m


@pytest.fixture(scope="module")
def mobilenet():
    model = mobilenet_v2()
    mod, params = relay.frontend.from_onnx(model)
    return model, relay.build(mod, target="llvm", params=params)


@pytest.mark.parametrize("name", light_names())
def test_the_onnx_wheels_networks_match_onnxruntime(name):
    model = light_model(name)
    mod, params = relay.frontend.from_onnx(model)
    lib = relay.build(mod, target="llvm", params=params)
    assert lib.executor["workspace_bytes"] < lib.executor["naive_bytes"]
    check(model, lib)


@pytest.mark.parametrize("batch", [1, 4])
def test_resnet18_structure_at_batch_1_and_4(batch):
    model = resnet18(batch=batch, size=40)
    mod, params = relay.frontend.from_onnx(model)
    check(model, relay.build(mod, params=params))


def test_batch_4_of_a_wheel_network():
    model = set_batch(light_model("squeezenet"), 4)
    mod, params = relay.frontend.from_onnx(model)
    check(model, relay.build(mod, params=params))


def test_mobilenet_v2_fuses_and_plans_memory(mobilenet):
    model, lib = mobilenet
    kernels = lib.executor["kernels"]
    convs = [k for k in kernels if k["fused"][0] == "nn.conv2d"]
    assert convs and all("BatchNormalization" in k["ops"] for k in convs)  # folded into the conv
    assert any(k["fused"] == ["nn.conv2d", "add", "clip"] for k in convs)   # BN bias + ReLU6
    assert any(k["fused"][-1] == "add" and k["fused"].count("add") == 2 for k in convs)  # residual
    assert lib.executor["workspace_bytes"] < lib.executor["naive_bytes"] / 2
    graph = json.loads(lib.get_graph_json())
    assert graph["heads"] and len(graph["attrs"]["shape"][1]) == len(graph["nodes"])
    check(model, lib)


def test_exported_module_runs_in_a_local_session_and_profiles(mobilenet, tmp_path):
    model, lib = mobilenet
    path = lib.export_library(tmp_path / "net.so")
    remote = rpc.LocalSession()
    remote.upload(str(path))
    rlib = remote.load_module("net.so")
    m = check(model, rlib, remote.cpu(0))
    result = m.benchmark(remote.cpu(0), number=2, repeat=2)
    assert len(result.results) == 2 and result.function == "default_run"
    dbg = debug_executor.create(lib.get_graph_json(), rlib, remote.cpu(0))
    dbg.set_input(**model_input(model))
    report = dbg.profile(number=2, repeat=2)
    assert len(report.rows) == len(lib.executor["kernels"])
    assert all(r["seconds"] > 0 for r in report.rows)
    assert abs(sum(r["share"] for r in report.rows) - 1) < 1e-9
    text = str(report)
    assert "sum of layers" in text and "Conv" in text
    onnx_names = {n.name for n in model.graph.node}
    assert {r["name"] for r in report.rows} <= onnx_names      # layers named by their nodes
    assert "<table>" in report._repr_html_()
    assert len(dbg.run_individual(number=1)) == len(report.rows)


def test_network_on_a_device_of_a_tracker(start_service, tracker, tmp_path, mobilenet):
    model, lib = mobilenet
    start_server(start_service, tracker, key="net")
    path = lib.export_library(tmp_path / "mobilenet.so")
    with rpc.connect_tracker("127.0.0.1", tracker.port).request("net", session_timeout=120) as remote:
        remote.upload(str(path))
        rlib = remote.load_module("mobilenet.so")
        dev = remote.cpu(0)
        m = check(model, rlib, dev)
        assert m.get_num_inputs() == 1 and m.get_num_outputs() == 1
        timing = rlib.time_evaluator("default_run", dev, number=2, repeat=2)(*m.module.run_args)
        assert len(timing.results) == 2
        times = m.module.profile_times(1)
        assert len(times) == len(lib.executor["kernels"]) and all(t > 0 for t in times)
        # weights can be replaced by name, as TVM's set_input(**params)
        params = lib.get_params()
        name = next(n for n, v in params.items() if v.ndim == 4)
        m.set_input(**{name: np.zeros_like(params[name])})
        m.run()
        changed = m.get_output(0).numpy()
        m.set_input(**{name: params[name]})
        m.run()
        again = m.get_output(0).numpy()
        assert not np.allclose(changed, again)
        with pytest.raises(GraphInputError, match="shape"):
            m.set_input("input", np.zeros((1, 3, 8, 8), np.float32))
        assert remote.get_function("testing.echo")(5) == 5     # the session goes on


def test_a_network_larger_than_the_device_allows_says_what_it_needs(start_service, mobilenet,
                                                                     tmp_path):
    from kernelrpc.errors import NetworkTooLarge

    _, lib = mobilenet
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "small",
                                                "--max-session-bytes", "1000000"])
    path = lib.export_library(tmp_path / "net.so")
    with rpc.connect(server.host, server.port, key="small") as remote:
        remote.upload(str(path))
        rlib = remote.load_module("net.so")
        with pytest.raises(NetworkTooLarge, match="MB weights.*--max-session-bytes"):
            rlib["default"](remote.cpu(0))
        assert remote.get_function("testing.echo")(1) == 1


def test_set_input_checks_name_shape_and_dtype(mobilenet):
    _, lib = mobilenet
    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    with pytest.raises(GraphInputError, match="no input 'data'"):
        m.set_input("data", np.zeros((1, 3, 64, 64), np.float32))
    with pytest.raises(GraphInputError, match="built for"):
        m.set_input("input", np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(GraphInputError, match="astype"):
        m.set_input(0, np.zeros((1, 3, 64, 64), np.float64))
    with pytest.raises(GraphInputError, match="no input or weight"):
        m.set_input(bogus=np.zeros(3, np.float32))
    with pytest.raises(IndexError):
        m.get_output(1)
    m.set_input(0, kernelrpc.nd.array(np.ones((1, 3, 64, 64), np.float32)))
    np.testing.assert_array_equal(m.get_input(0).numpy(), 1)


def test_graph_executor_create_takes_the_graph_json(mobilenet):
    model, lib = mobilenet
    m = graph_executor.create(lib.get_graph_json(), lib.runtime_module, kernelrpc.cpu(0))
    m.set_input(**model_input(model))
    m.run()
    with pytest.raises(ValueError, match="not the one"):
        graph_executor.create(json.dumps({"nodes": []}), lib.runtime_module, kernelrpc.cpu(0))


def test_a_tampered_executor_plan_is_refused(mobilenet, tmp_path):
    from kernelrpc.errors import ModuleError
    from kernelrpc.runtime.graph_executor import executor_plan

    _, lib = mobilenet
    plan = json.loads(json.dumps(lib.executor))
    assert executor_plan({"executor": plan}) == plan
    for key, value in [("params_bytes", -1), ("version", 99), ("inputs", "x"),
                       ("workspace_bytes", 1 << 60)]:
        bad = dict(plan, **{key: value})
        with pytest.raises(ModuleError):
            executor_plan({"executor": bad})
    bad = json.loads(json.dumps(plan))
    bad["params"][0]["offset"] = plan["params_bytes"]
    with pytest.raises(ModuleError, match="outside"):
        executor_plan({"executor": bad})
