"""bench/int8.py's command line and its cache of quantized models: a model is quantized once
per network, method, weight bits, onnxruntime version and float model, and read back after."""
import importlib.util
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime.quantization")

from kernelrpc.relay import testing

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "int8.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_int8", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_command_line(bench, tmp_path):
    opts = bench._parse(["--networks", "bert,resnet18", "--threads", "2,1", "--target", "llvm",
                         "--target", "llvm -mcpu=haswell", "--reduce-range",
                         "--cache-dir", str(tmp_path)])
    assert opts.networks == ["bert", "resnet18"] and opts.threads == [2, 1]
    assert opts.target == ["llvm", "llvm -mcpu=haswell"] and opts.reduce_range
    assert opts.cache_dir == tmp_path
    defaults = bench._parse([])
    assert defaults.networks == list(bench.NETWORKS) and defaults.target is None
    assert defaults.cache_dir.parts[-2:] == ("kernelrpc", "bench-int8")
    for bad in (["--networks", "resnet18,vgg"], ["--threads", "1,0"], ["--threads", "1,x"],
                ["--number", "0"], ["--repeat", "-1"]):
        with pytest.raises(SystemExit):
            bench._parse(bad)


def test_cache_keeps_each_quantization(bench, tmp_path):
    model = testing.transformer("bert", seq=8, width=16, heads=2, layers=1)
    first, cached = bench.quantize("bert", model, "dynamic", False, tmp_path)
    assert not cached and {n.op_type for n in first.graph.node} >= {"MatMulInteger"}
    (path,) = tmp_path.glob("*.onnx")
    stamp = path.stat().st_mtime_ns
    again, cached = bench.quantize("bert", model, "dynamic", False, tmp_path)
    assert cached and again == first and path.stat().st_mtime_ns == stamp
    _, cached = bench.quantize("bert", model, "dynamic", True, tmp_path)
    assert not cached
    other = testing.transformer("bert", seq=8, width=16, heads=2, layers=1, seed=1)
    _, cached = bench.quantize("bert", other, "dynamic", False, tmp_path)
    assert not cached
    assert len(list(tmp_path.glob("*.onnx"))) == 3 and not list(tmp_path.glob("tmp*"))


def test_static_quantization_and_its_output_step(bench, tmp_path):
    model = testing.resnet18(size=32, width=0.125, classes=10)
    int8, _ = bench.quantize("resnet18", model, "static", False, tmp_path)
    ops = {n.op_type for n in int8.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops and "BatchNormalization" not in ops
    assert bench.output_step(int8) > 0
    assert bench.output_step(model) is None
