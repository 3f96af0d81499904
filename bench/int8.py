"""int8 networks against their float32 builds and onnxruntime, in one process.

    python bench/int8.py [--networks resnet18,mobilenet_v2,bert] [--threads 1,2]
                         [--target "llvm -mcpu=haswell" --target llvm] [--reduce-range]
                         [--number 3] [--repeat 5] [--cache-dir DIR]

Networks built in code with seeded random weights (nothing is downloaded), quantized as
onnxruntime's docs advise (``quant_pre_process`` first): ResNet-18 and MobileNet-v2 at
224x224, full width, 1000 classes, by ``quantize_static`` (QDQ, per-channel, uint8
activations, int8 weights, four seeded random calibration batches), and a BERT-style encoder
(2 layers over 128 tokens of width 256, 4 heads) by ``quantize_dynamic`` (int8 weights), as
a user would a transformer. ``--reduce-range`` quantizes the weights to 7 bits
(``reduce_range=True``), which AVX2 targets and AVX-512 without VNNI want. The quantized
models are kept in ``--cache-dir`` (default ``$XDG_CACHE_HOME/kernelrpc/bench-int8``, else
``~/.cache/kernelrpc/bench-int8``), one file per network, method, weight bits, onnxruntime
version and float model, so a rerun does not quantize again.

For each network and target (``--target``, repeatable, default ``llvm``: this host) the int8
model and the float model it was quantized from are built and loaded here; for each thread
count of ``--threads`` the two builds of every target and onnxruntime's sessions of the two
models (``intra_op_num_threads`` the count, ``inter_op_num_threads`` 1) take turns, ``--repeat``
rounds, each turn ``--number`` untimed runs then ``--number`` timed ones (a disturbance of the
machine falls on all alike). kernelrpc's threads are the module's pool (``set_num_threads``).
onnxruntime always runs its own kernels for this host, whatever the target of the row.

The table: best and median ms of the rounds for each; "f32/int8" is kernelrpc's float32
median over its int8 median (above 1: int8 is faster); "int8/ort" kernelrpc's int8 median over
onnxruntime's int8 median (below 1: kernelrpc is faster); "top-1" the rows of the output
(each token's for the encoder) whose argmax is onnxruntime int8's; "max diff" the largest
absolute difference from onnxruntime int8's output, in quantization steps where that output
is quantized (a DequantizeLinear makes it), else as a share of the output's largest magnitude
(the dynamically quantized encoder: its int32 sums are exact, but its float operators round
differently from onnxruntime's, now and then an activation lands on the other side of a
rounding boundary of the next dynamic quantization, and the step carries through the layers
after); "f32 top-1" the same agreement of the float32 build with onnxruntime float32;
"disturbed" kernelrpc's turns whose conditions show other processes on the CPUs
(``ProfileResult.disturbed``).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

#: network -> how onnxruntime quantizes it
NETWORKS = {
    "resnet18": "static",
    "mobilenet_v2": "static",
    "bert": "dynamic",
}
#: calibration batches of quantize_static and their seed
CALIBRATION = (4, 3)
#: seconds between two timers' turns: a thread pool spins for a while after its last run
TURN_PAUSE = 0.05
MAX_THREADS = 256
#: onnxruntime's place among the timers' targets
ORT = None


def _threads(text: str) -> list[int]:
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"threads {text!r}: counts separated by commas") from None
    if not counts or any(not 1 <= n <= MAX_THREADS for n in counts):
        raise argparse.ArgumentTypeError(f"threads {text!r}: each count in [1, {MAX_THREADS}]")
    return counts


def _networks(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in NETWORKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown network {', '.join(unknown)}; choose from "
                                         f"{', '.join(NETWORKS)}")
    return names


def _positive(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer in [1, 10000]")
    return int(text)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kernelrpc" / "bench-int8"


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--networks", type=_networks, default=list(NETWORKS),
                   help=f"comma-separated, from {', '.join(NETWORKS)} (default: all)")
    p.add_argument("--threads", type=_threads, default=[1, 2],
                   help="thread counts, comma-separated (default: 1,2)")
    p.add_argument("--target", action="append", default=None,
                   help="build for this target (repeatable; default: llvm, this host)")
    p.add_argument("--reduce-range", action="store_true",
                   help="7-bit weights (onnxruntime's reduce_range), for AVX2 targets")
    p.add_argument("--number", type=_positive, default=3, help="timed runs a turn (default: 3)")
    p.add_argument("--repeat", type=_positive, default=5, help="rounds of turns (default: 5)")
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir(),
                   help=f"where quantized models are kept (default: {default_cache_dir()})")
    return p.parse_args(argv)


def float_network(name: str):
    from kernelrpc.relay import testing

    if name == "resnet18":
        return testing.resnet18(size=224, width=1.0, classes=1000)
    if name == "mobilenet_v2":
        return testing.mobilenet_v2(size=224, width=1.0, classes=1000)
    return testing.transformer("bert", seq=128, width=256, heads=4, layers=2)


def cache_key(name: str, method: str, reduce_range: bool, model) -> str:
    """The cached int8 model's file name: the network, the quantization and its weight bits,
    onnxruntime's version (which writes it) and a digest of the float model."""
    import onnxruntime

    digest = hashlib.sha256(model.SerializeToString()).hexdigest()[:16]
    bits = "w7" if reduce_range else "w8"
    return f"{name}-{method}-{bits}-ort{onnxruntime.__version__}-{digest}.onnx"


class Calibration:
    """Seeded random batches of the model's input for quantize_static (a
    ``CalibrationDataReader``: onnxruntime takes any object with ``get_next``)."""

    def __init__(self, model, count, seed):
        from kernelrpc.relay.testing import model_input

        self.batches = iter([model_input(model, seed=seed + k) for k in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantize(name: str, model, method: str, reduce_range: bool, cache_dir: Path):
    """The int8 model of the float ``model`` (the cached file when there is one) and whether it
    came from the cache."""
    import onnx
    from onnxruntime import quantization as q

    path = Path(cache_dir) / cache_key(name, method, reduce_range, model)
    if path.exists():
        return onnx.load(str(path)), True
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        source, pre, out = (Path(tmp) / f for f in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(model, str(source))
        q.quant_pre_process(str(source), str(pre))
        if method == "dynamic":
            q.quantize_dynamic(str(pre), str(out), weight_type=q.QuantType.QInt8,
                               reduce_range=reduce_range)
        else:
            q.quantize_static(str(pre), str(out), Calibration(model, *CALIBRATION),
                              quant_format=q.QuantFormat.QDQ,
                              activation_type=q.QuantType.QUInt8,
                              weight_type=q.QuantType.QInt8, per_channel=True,
                              reduce_range=reduce_range)
        os.replace(out, path)
    return onnx.load(str(path)), False


def output_step(model) -> float | None:
    """The quantization step of the model's first output: the scale of the DequantizeLinear
    that makes it (None for an output of a float operator)."""
    from onnx import numpy_helper

    out = model.graph.output[0].name
    node = next((n for n in model.graph.node if out in n.output), None)
    if node is None or node.op_type != "DequantizeLinear":
        return None
    scale = next((i for i in model.graph.initializer if i.name == node.input[1]), None)
    return None if scale is None else float(numpy_helper.to_array(scale).reshape(-1)[0])


def host_cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def target_label(target: str) -> str:
    """A target's name in the table: its vector unit, CPU and the instructions of its int8
    dot products (``avx2 haswell (avx2)``: ``vector_isa.int8_dot``)."""
    from kernelrpc.compiler.target import Target
    from kernelrpc.compiler.vector_isa import int8_dot, vector_isa

    parsed = Target(target)
    return f"{vector_isa(parsed).name} {parsed.cpu} ({int8_dot(parsed) or 'no int8 dot'})"


class Build:
    """A model built by kernelrpc for ``target`` and loaded in this process."""

    def __init__(self, model, target, feeds):
        import kernelrpc
        from kernelrpc import relay
        from kernelrpc.contrib import graph_executor

        start = time.perf_counter()
        mod, params = relay.frontend.from_onnx(model)
        lib = relay.build(mod, target=target, params=params)
        self.build_seconds = time.perf_counter() - start
        self.module = graph_executor.GraphModule(lib["default"](kernelrpc.cpu(0)))
        self.module.set_input(**feeds)
        self.disturbed = 0

    def set_threads(self, n: int) -> None:
        self.disturbed = 0
        got = self.module.set_num_threads(n)
        if got != n:
            print(f"  kernelrpc's pool took {got} threads, not {n}", file=sys.stderr)

    def output(self):
        self.module.run()
        return self.module.get_output(0).numpy()

    def seconds(self, number: int) -> float:
        result = self.module.benchmark(number=number, repeat=2)
        self.disturbed += result.disturbed
        return result.results[-1]


class Session:
    """onnxruntime's session of a model with ``threads`` intra-op threads."""

    def __init__(self, model, feeds, threads):
        from kernelrpc.relay.testing import onnxruntime_session

        self.session = onnxruntime_session(model, threads)
        self.feeds = feeds

    def output(self):
        return self.session.run(None, self.feeds)[0]

    def _seconds(self, number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            self.session.run(None, self.feeds)
        return (time.perf_counter() - start) / number

    def seconds(self, number: int) -> float:
        self._seconds(number)
        return self._seconds(number)


def take_turns(timers: dict, rounds: int, number: int) -> dict:
    """Each timer's seconds a run in each of ``rounds`` rounds, the timers taking turns."""
    times = {key: [] for key in timers}
    for _ in range(rounds):
        for key, timer in timers.items():
            time.sleep(TURN_PAUSE)
            times[key].append(timer.seconds(number))
    return times


def top1(got, ref) -> str:
    """Rows of the output (over its last axis) whose argmax is the reference's, of all."""
    got, ref = got.reshape(-1, got.shape[-1]), ref.reshape(-1, ref.shape[-1])
    return f"{int((got.argmax(-1) == ref.argmax(-1)).sum())}/{len(ref)}"


def ms(values) -> str:
    return f"{min(values) * 1e3:.2f}/{statistics.median(values) * 1e3:.2f}"


def row(target, timers, times, step, rounds) -> list[str]:
    """A target's columns of the table after the network and thread count."""
    import numpy as np

    got8, got32 = timers[target, "int8"].output(), timers[target, "f32"].output()
    ref8, ref32 = timers[ORT, "int8"].output(), timers[ORT, "f32"].output()
    diff = float(np.abs(got8 - ref8).max())
    diff_text = (f"{diff:.3g} ({diff / step:.1f} steps)" if step else
                 f"{diff:.3g} ({diff / np.abs(ref8).max():.1%} of max)")
    median = {key: statistics.median(values) for key, values in times.items()}
    disturbed = timers[target, "int8"].disturbed + timers[target, "f32"].disturbed
    return [ms(times[target, "int8"]), ms(times[target, "f32"]), ms(times[ORT, "int8"]),
            ms(times[ORT, "f32"]), f"{median[target, 'f32'] / median[target, 'int8']:.2f}x",
            f"{median[target, 'int8'] / median[ORT, 'int8']:.2f}x", top1(got8, ref8), diff_text,
            top1(got32, ref32), f"{disturbed}/{2 * rounds}"]


def main(opts) -> int:
    from kernelrpc.relay.testing import model_input

    targets = opts.target or ["llvm"]
    labels = {t: target_label(t) for t in targets}
    rows = []
    for name in opts.networks:
        model = float_network(name)
        start = time.perf_counter()
        int8, cached = quantize(name, model, NETWORKS[name], opts.reduce_range, opts.cache_dir)
        print(f"{name}: int8 model {'from the cache' if cached else 'quantized'} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
        feeds = model_input(model)
        step = output_step(int8)
        builds = {}
        for target in targets:
            builds[target] = Build(int8, target, feeds), Build(model, target, feeds)
            print(f"{name} [{labels[target]}]: built int8 in {builds[target][0].build_seconds:.1f} s,"
                  f" float32 in {builds[target][1].build_seconds:.1f} s", flush=True)
        for n in opts.threads:
            timers = {}
            for target, (b8, b32) in builds.items():
                b8.set_threads(n)
                b32.set_threads(n)
                timers[target, "int8"], timers[target, "f32"] = b8, b32
            timers[ORT, "int8"] = Session(int8, feeds, n)
            timers[ORT, "f32"] = Session(model, feeds, n)
            times = take_turns(timers, opts.repeat, opts.number)
            for target in targets:
                rows.append([name, labels[target], str(n)] +
                            row(target, timers, times, step, opts.repeat))
            print(f"{name} threads={n}: done", flush=True)

    print()
    print(f"Host CPU: {host_cpu()} ({os.cpu_count()} CPUs); onnxruntime runs its own kernels for "
          "this host in every row.")
    print(f"int8: {'7-bit' if opts.reduce_range else '8-bit'} weights; ms: best/median of "
          f"{opts.repeat} rounds of {opts.number} runs, all builds and sessions of a network "
          "and thread count taking turns; ratios of medians.")
    header = ["network", "target", "thr", "int8 ms", "float32 ms", "ort int8 ms", "ort f32 ms",
              "f32/int8", "int8/ort", "top-1", "max diff", "f32 top-1", "disturbed"]
    table = [header] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for k, r in enumerate(table):
        print("  ".join(c.rjust(w) if i > 1 else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main(_parse()))
