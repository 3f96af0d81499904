"""Tuning integer layers: a quantized network's ``qnn.conv2d`` and ``qnn.dense`` layers as
AutoTVM tasks of their own templates (``qnn_conv2d_nchw``, ``qnn_dense``), every configuration
of their spaces against the operator's numpy form, their logged configurations in
``relay.build``, and the model command tuning a quantized network on a device server."""
import json
import random
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("cloudpickle")

import kernelrpc  # noqa: E402
from kernelrpc import autotvm, relay  # noqa: E402
from kernelrpc.contrib import graph_executor  # noqa: E402
from kernelrpc.relay import tuning  # noqa: E402
from kernelrpc.relay.op import quant  # noqa: E402
from servicectl import child_env  # noqa: E402
from target_families import family_params  # noqa: E402
from test_onnx_quant import QuantFormat, cnn_model, encoder_model, quantized, stem_model  # noqa: E402
from test_relay_tuning import TARGET, record, run_config  # noqa: E402

#: quantized networks whose layers take every integer form: packed, pixels over a window,
#: depthwise on the float schedules, packed dense; plain dense with a run-time zero point
NETWORKS = {
    "cnn QDQ per-channel": (cnn_model, [1, 3, 11, 13], dict(per_channel=True)),
    "cnn QOperator": (cnn_model, [1, 3, 11, 13], dict(quant_format=QuantFormat.QOperator)),
    "stem": (stem_model, [1, 3, 32, 32], {}),
    "encoder dynamic": (encoder_model, [1, 7, 16], dict(dynamic=True)),
}


@pytest.fixture(scope="module", params=list(NETWORKS))
def network(request, tmp_path_factory):
    make, shape, options = NETWORKS[request.param]
    model = quantized(tmp_path_factory.mktemp("int8"), make(), shape, **options)
    mod, params = relay.frontend.from_onnx(model)
    return model, mod, params


def integer_layers(mod, params) -> list:
    lib = relay.build(mod, target=TARGET, params=params)
    return [r for r in lib.executor["kernels"] if r["fused"][0] in tuning.INTEGER_OPS]


def test_every_integer_layer_is_a_task_whose_configurations_compute_it(network):
    """Each task's default, last and four sampled configurations (every configuration of the
    integer strategies' spaces: tests/test_int8_dots.py and the depthwise ones')."""
    _, mod, params = network
    tasks = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    layers = integer_layers(mod, params)
    assert layers and {t.name for t in tasks} <= {"qnn_conv2d_nchw", "qnn_dense"}
    assert sum(t.layers for t in tasks) == len(layers)
    assert sorted(json.dumps(r["workload"]) for r in layers) == \
        sorted(json.dumps(t.workload[:4]) for t in tasks for _ in range(t.layers))
    check_configurations(tasks)


def check_configurations(tasks):
    """Each task's default, last and four sampled configurations against numpy, on its sampled
    operands."""
    for task in tasks:
        inputs = task.prepare_inputs(None)
        expect = task.reference(*inputs)
        assert len(np.unique(expect)) > min(16, expect.size // 4), \
            "the sampled operands leave the outputs clamped"
        space = task.config_space
        for index in {0, len(space) - 1, *random.Random(1).sample(range(len(space)),
                                                                  min(4, len(space)))}:
            config = space.get(index)
            np.testing.assert_array_equal(run_config(task, config, inputs), expect,
                                          err_msg=f"{task.workload[:3]} {config}")


@pytest.mark.parametrize("target", family_params())
def test_integer_tasks_on_every_x86_width(target, tmp_path):
    """The tasks of each x86 family's build (AVX-512's and AVX2's `vpmaddubsw` records,
    SSE's plain vectors), run where this host can run their code."""
    model = quantized(tmp_path, cnn_model(), [1, 3, 11, 13], per_channel=True)
    mod, params = relay.frontend.from_onnx(model)
    tasks = autotvm.task.extract_from_program(mod, target=target, params=params)
    assert tasks and all(t.target == str(target) for t in tasks)
    check_configurations(tasks)


def test_a_task_computes_its_layer_with_the_networks_own_constants(network):
    """The strategy whose instruction the weight fits and the sums' type are recorded in the
    workload, so that the task's layer computes what the network's does: its default
    configuration on the layer's own weight, zero point, bias and multipliers equals the
    operator's numpy form."""
    from kernelrpc.compiler.target import Target
    from kernelrpc.relay.fuse import partition
    from kernelrpc.relay.op import OPS
    from kernelrpc.relay.strategy import tiles_for
    from kernelrpc.relay.transform import optimize

    _, mod, params = network
    tasks = {json.dumps(t.workload[:4]): t for t in
             autotvm.task.extract_from_program(mod, target=TARGET, params=params)}
    func = tuning.int8_forms(optimize(mod["main"], params), tiles_for(Target(TARGET)))
    anchors = [g.anchor for g in partition(func)
               if g.anchor is not None and g.anchor.op in tuning.INTEGER_OPS]
    assert anchors
    for anchor in anchors:
        task = tasks[json.dumps(list(tuning.workload(anchor, TARGET)[:4]))]
        attrs = dict(task.args[2])
        assert attrs["operands"] == [[list(i.shape), i.dtype] for i in anchor.inputs]
        sampled = quant.sample_operands(anchor)     # data, and a zero point computed at run time
        operands = [v if i.value is None else i.value for i, v in zip(anchor.inputs, sampled)]
        assert all(i.value is not None for i in anchor.inputs[1:2])
        np.testing.assert_array_equal(run_config(task, task.config_space.get(0), operands),
                                      OPS[anchor.op].fold(operands, anchor.attrs))


def outputs(lib, model):
    from kernelrpc.relay.testing import model_input

    m = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
    m.set_input(**model_input(model))
    m.run()
    return [m.get_output(k).numpy() for k in range(m.get_num_outputs())]


def test_relay_build_takes_the_logged_integer_configurations(network, tmp_path):
    model, mod, params = network
    tasks = autotvm.task.extract_from_program(mod, target=TARGET, params=params)
    log_file = tmp_path / "int8.log"
    chosen = {json.dumps([t.name, *t.args]): len(t.config_space) - 1 for t in tasks}
    log_file.write_text("".join(json.dumps(record(t, 0, 2e-3)) + "\n" +   # the last the fastest
                                json.dumps(record(t, len(t.config_space) - 1, 1e-3)) + "\n"
                                for t in tasks))
    untuned = relay.build(mod, target=TARGET, params=params)
    with autotvm.apply_history_best(str(log_file)):
        tuned = relay.build(mod, target=TARGET, params=params)
    layers = [r for r in tuned.executor["kernels"] if r["fused"][0] in tuning.INTEGER_OPS]
    assert layers and all(r["schedule"] == "tuned" for r in layers)
    for r in layers:
        task = next(t for t in tasks if t.workload[:4] == tuple(r["workload"]))
        wanted = task.config_space.get(chosen[json.dumps([task.name, *task.args])]).to_dict()
        assert r["config"] == wanted
    for got, want in zip(outputs(tuned, model), outputs(untuned, model)):
        np.testing.assert_array_equal(got, want)


def test_model_command_tunes_a_quantized_network(tmp_path):
    """Measured on a device server: an integer layer's zero point is a 0-d operand, which
    reaches the device as it is."""
    model = quantized(tmp_path, stem_model(), [1, 3, 32, 32], per_channel=True)
    path = tmp_path / "stem_int8.onnx"
    onnx.save(model, str(path))
    log_file = tmp_path / "stem.log"
    done = subprocess.run([sys.executable, "-m", "kernelrpc.model", str(path), "--tune", "2",
                           "--log", str(log_file), "--json", "--repeat", "2", "--number", "2",
                           "--no-db"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=child_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    tasks = report["tuning"]["tasks"]
    assert [t["workload"][0] for t in tasks] == ["qnn_conv2d_nchw", "qnn_dense"]
    assert report["schedules"]["default"] == [] and len(report["schedules"]["tuned"]) == 2
    logged = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert logged and all(r["result"]["status"] == "ok" for r in logged), \
        [r["result"].get("error") for r in logged]
