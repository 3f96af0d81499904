"""``python -m kernelrpc.model``: run as a user runs it, here and on a device of a tracker."""
import json
import subprocess
import sys

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from kernelrpc.relay.testing import resnet18  # noqa: E402
from servicectl import child_env, start_server  # noqa: E402


def run_model(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kernelrpc.model", *args, "--db", str(cwd / "results.sqlite")],
                          cwd=cwd, capture_output=True, text=True, timeout=600, env=child_env())


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "resnet.onnx"
    onnx.save(resnet18(size=32, width=0.125, classes=20), str(path))
    return path


def test_local_run_prints_summary_latency_profile_and_agreement(model_file, tmp_path):
    done = run_model(str(model_file), "--local", "--profile", "--repeat", "2", "--number", "2",
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Conv " in out and "parameters" in out and "GFLOP" in out
    assert "Execution time summary" in out and "Slowest" in out and "sum of layers" in out
    assert "top-5 matches" in out
    assert (tmp_path / "resnet.so").is_file()
    assert f"module at {tmp_path / 'resnet.so'}; rerun: python -m kernelrpc.model" in out


def test_json_on_a_device_of_a_tracker(model_file, tmp_path, start_service, tracker):
    start_server(start_service, tracker, key="cli")
    done = run_model(str(model_file), "--tracker", f"127.0.0.1:{tracker.port}", "--key", "cli",
                     "--json", "--repeat", "2", "--number", "1", "--threads", "1",
                     "--output", str(tmp_path / "out.so"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["summary"]["operators"]["Conv"] > 10
    assert report["module"]["arena_bytes"] < report["module"]["naive_bytes"]
    assert len(report["latency"]["results"]) == 2
    assert report["onnxruntime"]["outputs"][0]["relative"] < 1e-3
    assert report["onnxruntime"]["host_latency"]["median_s"] > 0     # beside the board's time
    assert report["device"].startswith("key 'cli'")


def test_an_unsupported_model_is_one_line_without_a_traceback(tmp_path):
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    path = tmp_path / "unique.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    done = run_model(str(path), "--local", cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Unique" in done.stderr
    done = run_model(str(tmp_path / "missing.onnx"), "--local", cwd=tmp_path)
    assert done.returncode == 1 and "no model file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_reference_reports_the_quantization_error_against_the_float_network(tmp_path):
    """A QDQ network with ``--reference`` its float network: kernelrpc's quantization error
    is onnxruntime's int8 error within one output step; a float network with other inputs is
    refused by name."""
    pytest.importorskip("onnxruntime")
    from test_onnx_quant import CNN_CASES, cnn_model, output_steps, quantized

    model = quantized(tmp_path, cnn_model(), (1, 3, 11, 13), **CNN_CASES["qdq-u8s8-per-channel"])
    onnx.save(model, tmp_path / "int8.onnx")                    # beside float.onnx
    done = run_model("int8.onnx", "--local", "--repeat", "1", "--number", "1", "--json",
                     "--reference", "float.onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (report,) = json.loads(done.stdout)["quantization"]["outputs"]
    ours, theirs = report["kernelrpc"], report["onnxruntime"]
    assert 0 < ours["max_abs_error"] and 0 < theirs["max_abs_error"]
    (step,) = output_steps(model)
    assert abs(ours["max_abs_error"] - theirs["max_abs_error"]) <= step * (1 + 1e-5)
    assert 0 <= ours["top1_agreement"] <= 1
    text = run_model("int8.onnx", "--local", "--repeat", "1", "--number", "1", "--no-db",
                     "--reference", "float.onnx", cwd=tmp_path)
    assert "float32      output 0 vs float.onnx: kernelrpc max error" in text.stdout
    assert "onnxruntime's max error" in text.stdout

    other = cnn_model()
    other.graph.input[0].name = "image"
    other.graph.node[0].input[0] = "image"
    onnx.save(other, tmp_path / "other.onnx")
    refused = run_model("int8.onnx", "--local", "--repeat", "1", "--number", "1", "--no-db",
                        "--reference", "other.onnx", cwd=tmp_path)
    assert refused.returncode == 1
    assert "its inputs ['image'] are not the model's ['x']" in refused.stderr
