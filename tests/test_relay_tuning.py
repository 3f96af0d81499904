"""Tuning a network: its layers as AutoTVM tasks, their configurations in relay.build, and the
whole flow (``python -m kernelrpc.model --tune``) on a device server started as users start it."""
import json
import logging
import random
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("cloudpickle")

import kernelrpc  # noqa: E402
from kernelrpc import autotvm, nd, relay  # noqa: E402
from kernelrpc.autotvm.record import VERSION  # noqa: E402
from kernelrpc.compiler.target import Target  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import tuning  # noqa: E402
from kernelrpc.relay.op.reference import conv2d_reference  # noqa: E402
from kernelrpc.relay.testing import model_input, onnxruntime_outputs, resnet18  # noqa: E402
from servicectl import child_env  # noqa: E402

TARGET = Target(None)


@pytest.fixture(scope="module")
def small_resnet():
    model = resnet18(size=32, width=0.125, classes=20)
    mod, params = relay.frontend.from_onnx(model)
    return model, mod, params


def conv_workload(data, weight, **attrs):
    attrs = {"dilation": [1, 1], "groups": 1, "padding": [0, 0, 0, 0], "strides": [1, 1], **attrs}
    return ("conv2d_nchw", data, weight, [[k, v] for k, v in sorted(attrs.items())], "float32",
            str(TARGET))


def run_config(task, config, inputs):
    s, args = task.instantiate(config)
    lib = kernelrpc.build(s, args, target=task.target)
    out = nd.empty(task.arg_specs[-1][0], task.arg_specs[-1][1])
    lib[lib.metadata["functions"][0]["name"]](*(nd.array(a) for a in inputs), out)
    return out.numpy()


def test_extract_from_program_gives_one_task_per_distinct_layer(small_resnet):
    _, mod, params = small_resnet
    tasks = autotvm.task.extract_from_program(mod["main"], target=TARGET, params=params)
    names = [t.name for t in tasks]
    assert names.count("dense") == 1 and names.count("conv2d_nchw") == len(tasks) - 1
    assert len({json.dumps(t.workload) for t in tasks}) == len(tasks)
    assert sum(t.layers for t in tasks) == 21         # 20 convolutions (one 7x7) and the dense
    assert all(t.flop > 0 and len(t.config_space) > 1 for t in tasks)
    convs = autotvm.task.extract_from_program(mod, target=TARGET, params=params, ops=["nn.conv2d"])
    assert [t.workload for t in convs] == [t.workload for t in tasks if t.name == "conv2d_nchw"]
    with pytest.raises(ValueError, match="nn.max_pool2d.*tunable"):
        autotvm.task.extract_from_program(mod, target=TARGET, params=params, ops=["nn.max_pool2d"])


@pytest.mark.parametrize("data, weight, attrs", [
    ([1, 8, 9, 11], [16, 8, 3, 3], dict(padding=[1, 1, 1, 1])),
    ([1, 8, 9, 11], [16, 8, 3, 3], dict(padding=[1, 0, 2, 1], strides=[2, 2])),
    ([1, 12, 10, 13], [12, 1, 3, 3], dict(groups=12, padding=[1, 1, 1, 1], strides=[2, 2])),
    ([1, 8, 10, 13], [8, 4, 3, 3], dict(dilation=[2, 2], groups=2, padding=[2, 2, 2, 2])),
    ([1, 6, 10, 13], [20, 6, 1, 1], {}),
])
def test_every_sampled_configuration_computes_the_convolution(data, weight, attrs):
    task = tuning.task_of(conv_workload(data, weight, **attrs), flop=1.0)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(dtype)
              for shape, dtype in task.arg_specs[:task.n_inputs]]
    if task.prepare_inputs is not None:
        inputs = task.prepare_inputs(inputs)
    expect = task.reference(*inputs)
    space = task.config_space
    for index in {0, len(space) - 1, *random.Random(1).sample(range(len(space)),
                                                              min(4, len(space)))}:
        got = run_config(task, space.get(index), inputs)
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4, err_msg=str(space.get(index)))


def test_the_numpy_reference_is_onnxruntime_s_convolution():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 8, 11, 10)).astype("float32")
    w = rng.standard_normal((8, 4, 3, 2)).astype("float32")
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=2, strides=[2, 1], dilations=[1, 2],
                            pads=[1, 0, 2, 1])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (expect,) = onnxruntime_outputs(model, {"x": x})
    got = conv2d_reference(x, w, strides=[2, 1], padding=[1, 0, 2, 1], dilation=[1, 2],
                                  groups=2)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)


def test_every_dense_configuration_computes_the_product():
    task = tuning.task_of(("dense", [3, 40], [40, 37], [], "float32", str(TARGET)), flop=1.0)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((3, 40)).astype("float32"),
              rng.standard_normal((40, 37)).astype("float32")]
    for index in range(len(task.config_space)):
        np.testing.assert_allclose(run_config(task, task.config_space.get(index), inputs),
                                   inputs[0] @ inputs[1], rtol=1e-4, atol=1e-4)


def record(task, index, mean):
    config = task.config_space.get(index)
    return {"version": VERSION, "workload": [task.name, *task.args], "target": task.target,
            "config": {"index": index, "knobs": config.to_dict()},
            "result": {"status": "ok", "costs": [mean], "mean": mean}}


def test_relay_build_takes_the_logged_best_and_names_the_layers_left_default(small_resnet, tmp_path,
                                                                            caplog):
    model, mod, params = small_resnet
    tasks = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    tuned, untuned = tasks[:-3], tasks[-3:]
    lines = []
    for task in tuned:                      # the last configuration the fastest, the first slower
        last = len(task.config_space) - 1
        lines += [record(task, 0, 2e-3), record(task, last, 1e-3)]
    log_file = tmp_path / "net.log"
    log_file.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"truncated": \n')
    with caplog.at_level(logging.WARNING), autotvm.apply_history_best(str(log_file)):
        lib = relay.build(mod, target=TARGET, params=params)
    kernels = lib.executor["kernels"]
    kinds = [k["schedule"] for k in kernels if k["schedule"]]
    layers_untuned = sum(t.layers for t in untuned)
    assert kinds.count("default") == layers_untuned and kinds.count("tuned") == 21 - layers_untuned
    assert f"{layers_untuned} of 21 tunable layers have no tuned configuration" in caplog.text
    best = [t.config_space.get(len(t.config_space) - 1).to_dict() for t in tuned]
    assert all(k["config"] in best for k in kernels if k["schedule"] == "tuned")
    assert all("config" not in k for k in kernels if k["schedule"] != "tuned")

    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    feeds = model_input(model)
    m.set_input(**feeds)
    m.run()
    np.testing.assert_allclose(m.get_output(0).numpy(), onnxruntime_outputs(model, feeds)[0],
                               rtol=1e-3, atol=1e-3)


def test_a_logged_configuration_that_no_longer_fits_is_logged_and_left_default(small_resnet,
                                                                              caplog):
    _, mod, params = small_resnet
    task = autotvm.task.extract_from_program(mod, target=TARGET, params=params)[1]
    stale = record(task, 0, 1e-3)
    stale["config"]["knobs"]["tile_f"] = 7
    with caplog.at_level(logging.WARNING), autotvm.apply_history_best([stale]):
        lib = relay.build(mod, target=TARGET, params=params)
    assert "does not fit its template" in caplog.text
    assert "tuned" not in {k["schedule"] for k in lib.executor["kernels"]}


def test_tuner_measures_the_default_first(small_resnet):
    _, mod, params = small_resnet
    tasks = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    task = max(tasks, key=lambda t: len(t.config_space))
    assert len(task.config_space) > 8
    tuner = autotvm.tuner.RandomTuner(task, seed=3)
    batch = tuner._with_default(tuner.next_batch(4))
    assert batch[0].index == 0 and len(batch) == 4
    tuner.visited.add(0)
    assert all(c.index != 0 for c in tuner._with_default(tuner.next_batch(4)))


def run_model(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kernelrpc.model", *args, "--db", str(cwd / "results.sqlite")],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env=child_env())


def test_model_command_tunes_resumes_and_builds_with_the_log(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.2, n)
             for n, s in [("w1", (8, 3, 3, 3)), ("w2", (8, 8, 1, 1)), ("fc", (8, 10))]]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 12, 12])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    log_file = tmp_path / "tiny.log"
    common = [str(path), "--tune", "3", "--log", str(log_file), "--json", "--repeat", "2",
              "--number", "2"]

    first = run_model(*common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    tasks = report["tuning"]["tasks"]
    assert [t["workload"][0] for t in tasks] == ["conv2d_nchw", "conv2d_nchw", "dense"]
    assert all(t["resumed"] == 0 and t["measured"] >= 3 and t["default_seconds"] for t in tasks)
    assert report["schedules"]["default"] == [] and len(report["schedules"]["tuned"]) == 3
    assert report["onnxruntime"]["outputs"][0]["relative"] < 1e-4
    assert report["untuned_latency"]["results"] and report["latency"]["results"]
    logged = log_file.read_text().splitlines()
    assert len(logged) == sum(t["measured"] for t in tasks)

    again = run_model(*common, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)["tuning"]
    assert resumed["measured"] == 0
    assert [t["resumed"] for t in resumed["tasks"]] == [t["measured"] for t in tasks]
    assert log_file.read_text().splitlines() == logged

    no_log = run_model(str(path), "--tune", "3", cwd=tmp_path)
    assert no_log.returncode != 0 and "--tune needs --log" in no_log.stderr


def test_tune_network_example_runs_without_a_tracker(tmp_path):
    import os
    import socket
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]          # closed once the block ends: nothing listens
    env = dict(child_env(), PYTHONPATH=str(root / "src"))
    env.pop("KERNELRPC_TRACKER", None)
    log_file = tmp_path / "net.log"
    done = subprocess.run([sys.executable, str(root / "examples" / "tune_network.py"), "--size",
                           "32", "--width", "0.125", "--trials", "2", "--tracker",
                           f"127.0.0.1:{port}", "--log", str(log_file)], capture_output=True,
                          text=True, env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started a local tracker" in done.stdout
    assert "12 tasks for 21 layers" in done.stdout and "[Task 12/12] dense" in done.stdout
    assert "untuned: mean" in done.stdout and "tuned:   mean" in done.stdout
    assert log_file.stat().st_size > 0
