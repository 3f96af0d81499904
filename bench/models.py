"""Whole networks: import, build, module size, memory plan, and latency on a device server of
this host next to onnxruntime on the same machine, same threads, in the same run.

    python bench/models.py [--networks resnet18,mobilenet_v2,squeezenet] [--threads 1,2]
                           [--batch 1] [--number 5] [--repeat 5] [--tune TRIALS --log-dir DIR]
                           [--target "llvm -mcpu=haswell" --target llvm]

The device is a real device server (``python -m kernelrpc.server``) behind a tracker on
loopback; its latency is ``default_run`` timed by the module's native loop. onnxruntime runs in
this process with ``intra_op_num_threads`` set to the same count, timed with the same
number/repeat, its rounds taking turns with kernelrpc's (untuned, tuned, onnxruntime, then
again: a disturbance of the machine falls on all alike). "layers" is the per-layer profile's sum
against the end-to-end median (the executor's own cost per layer in the last column).
Networks: resnet18 and mobilenet_v2 built in code at full width and 224x224, transformers built
in code as torch exports them (bert: an encoder of 2 layers over 128 tokens of width 256; vit:
the same over a 224x224 image's 196 patches and a class token; gpt2: a decoder block of 2
layers over 64 tokens with a causal mask), and the networks the onnx wheel ships (resnet50,
squeezenet, inception_v1, shufflenet, densenet121, vgg19...), all with seeded random weights.
Nothing is downloaded.

``--target`` (repeatable) builds every network for each target given (default: this host,
``llvm``): ``--target "llvm -mcpu=haswell" --target llvm`` measures AVX2 code and this host's
own side by side on one host (the target must run here). Each target's rows and per-class
table say which it was, and the per-class share of peak is of that target's peak
(``kernelrpc.compiler.peak``). onnxruntime always runs its own kernels for this host.

``--tune TRIALS`` first tunes each network's convolutions and dense layers on the same device
server (AutoTVM's flow, up to TRIALS configurations per task, logs in ``--log-dir``, resumed
when they exist) and adds the tuned latency beside the untuned one, and a table of the tuning
runs: tasks, measurements, builds run and candidates taken from the build cache, wall time,
builds and measurements per second, the seconds the device was held, the share of those it
did not measure ("device idle") and the share of the run it measured.

When Apache TVM is installed here, its untuned build of the same ONNX file (``relax`` frontend,
``tvm.compile`` for this CPU, the relax VM) runs once per network in a child process, timed by
its own ``time_evaluator`` (one run per repeat): its default pipeline schedules no loop, so
the thread count changes nothing and the figure stands in every row of the network.
``--no-tvm`` skips it, ``--tvm-timeout`` bounds it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kernelrpc.compiler.peak import fma_peak_gflops

DEFAULT = ("resnet18,mobilenet_v2,resnet50,squeezenet,inception_v1,shufflenet,densenet121,vgg19,"
           "bert,vit,gpt2")


def _parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--networks", default=DEFAULT)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--target", action="append", default=None,
                   help="build for this target (repeatable; default: llvm, this host)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--number", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tiny-layers", type=int, default=200,
                   help="layers of the network that measures the executor's own cost")
    p.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                   help="tune every network first, up to TRIALS configurations per task")
    p.add_argument("--log-dir", default=".", help="where the tuning logs go (NETWORK.log)")
    p.add_argument("--no-tvm", action="store_true", help="skip Apache TVM's column")
    p.add_argument("--tvm-timeout", type=float, default=600.0, help="seconds per TVM build and run")
    p.add_argument("--tvm-worker", nargs=3, metavar=("MODEL", "NUMBER", "REPEAT"),
                   help=argparse.SUPPRESS)
    return p.parse_args(argv)


#: operator classes of the per-class table
CLASSES = ("conv 1x1", "conv 3x3", "conv strided", "conv depthwise", "conv grouped",
           "conv other", "dense 1 row", "dense rows", "batch matmul", "pooling", "softmax",
           "normalization", "elementwise", "other")


def op_class(record) -> str:
    """The layer class of a kernel record of the executor (its workload, else its anchor)."""
    workload = record.get("workload")
    fused = record.get("fused", [])
    if workload:
        name, data, weight, attrs = workload[:4]
        if name in ("dense", "qnn_dense"):
            return "dense 1 row" if data[0] == 1 else "dense rows"
        attrs = dict(attrs)
        groups = attrs.get("groups", 1)
        if groups > 1:
            return "conv depthwise" if weight[1] == 1 else "conv grouped"
        if list(attrs.get("strides", [1, 1])) != [1, 1]:
            return "conv strided"
        kernel = tuple(attrs.get("window") or weight[2:4])    # a packed int8 weight: 6-D
        return {(1, 1): "conv 1x1", (3, 3): "conv 3x3"}.get(kernel, "conv other")
    anchors = {"nn.batch_matmul": "batch matmul", "nn.pool2d": "pooling",
               "nn.global_pool": "pooling", "nn.softmax": "softmax", "nn.normalize": "normalization",
               "nn.lp_normalize": "normalization", "nn.lrn": "normalization"}
    for op in fused:
        if op in anchors:
            return anchors[op]
    if fused and not any(op.startswith("nn.") or op == "reduce" for op in fused):
        return "elementwise"
    return "other"


def class_table(kernels, report) -> dict:
    """Per operator class: layers, seconds and FLOPs of one per-layer profile (``kernels``: the
    executor's kernel records, in the profile's order)."""
    out = {c: [0, 0.0, 0] for c in CLASSES}
    for record, row in zip(kernels, report.rows):
        entry = out[op_class(record)]
        entry[0] += 1
        entry[1] += row["seconds"]
        entry[2] += row["flops"]
    return out


def tvm_worker(path, number, repeat) -> dict:
    """In a child process: TVM's untuned build of the ONNX file and its median latency."""
    import numpy as np
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = onnx.load(path)
    start = time.perf_counter()
    mod = from_onnx(model, keep_params_in_input=False)
    target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()
                                if hasattr(tvm.target, "codegen") else "native"})
    executable = tvm.compile(mod, target=target)
    build = time.perf_counter() - start
    vm = relax.VirtualMachine(executable, tvm.cpu())
    rng = np.random.default_rng(1)
    args = [tvm.runtime.tensor(rng.standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32"))
        for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    timer = vm.time_evaluator("main", tvm.cpu(), number=number, repeat=repeat)
    return {"tvm": tvm.__version__, "build_seconds": build, "median": timer(*args).median}


def tvm_seconds(model, opts, tmp) -> float | None:
    """Apache TVM's untuned latency of ``model``, or None (not installed, failed or timed
    out: said on stderr)."""
    import importlib.util

    import onnx

    if importlib.util.find_spec("tvm") is None:
        return None
    path = Path(tmp) / "tvm-model.onnx"
    onnx.save(model, str(path))
    try:
        done = subprocess.run([sys.executable, __file__, "--tvm-worker", str(path), "1",
                               str(opts.repeat)], capture_output=True, text=True,
                              timeout=opts.tvm_timeout, env={**os.environ, "TVM_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        print(f"  Apache TVM: no result within {opts.tvm_timeout:.0f} s", file=sys.stderr)
        return None
    if done.returncode != 0:
        print(f"  Apache TVM could not build or run it: "
              f"{(done.stderr.strip().splitlines() or ['?'])[-1][:300]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["median"]


def network(name: str, batch: int):
    from kernelrpc.relay import testing

    if name == "resnet18":
        return testing.resnet18(batch=batch, size=224, width=1.0, classes=1000)
    if name == "mobilenet_v2":
        return testing.mobilenet_v2(batch=batch, size=224, width=1.0, classes=1000)
    if name in ("bert", "vit", "gpt2"):
        if batch != 1:
            raise SystemExit(f"{name}: the transformers are built for batch 1")
        return testing.transformer(name, seq=64 if name == "gpt2" else 128)
    model = testing.light_model(name)
    return testing.set_batch(model, batch) if batch != 1 else model


def tiny_layers(count: int):
    """``count`` chained reductions over a one-element axis of a 16-element tensor: kernels
    that do almost nothing, so the network's time per layer is the executor's own cost plus
    one trivial kernel call."""
    from onnx import TensorProto, helper

    nodes, prev = [], "x"
    for k in range(count):
        nodes.append(helper.make_node("ReduceMax", [prev], [f"r{k}"], axes=[0], keepdims=1))
        prev = f"r{k}"
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


class OrtSession:
    """onnxruntime on the model with ``threads`` intra-op threads, timed ``number`` runs at a
    time."""

    def __init__(self, model, feeds, threads):
        from kernelrpc.relay.testing import onnxruntime_session

        self.session = onnxruntime_session(model, threads)
        self.feeds = feeds
        self.output = self.session.run(None, feeds)[0]

    def seconds(self, number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            self.session.run(None, self.feeds)
        return (time.perf_counter() - start) / number


def ort_seconds(model, feeds, threads, number, repeat):
    session = OrtSession(model, feeds, threads)
    return statistics.median(session.seconds(number) for _ in range(repeat)), session.output


#: seconds between two timers' turns: the thread pools of the one before (onnxruntime's, a
#: module's) spin for a while after their last run, and would take the next one's cores
TURN_PAUSE = 0.05


def interleaved(rounds: int, timers: dict) -> dict:
    """Each timer's median over ``rounds`` rounds, the timers taking turns within each round
    (so that a disturbance of the machine falls on all of them alike), :data:`TURN_PAUSE`
    apart."""
    times = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            time.sleep(TURN_PAUSE)
            times[name].append(timer())
    return {name: statistics.median(values) for name, values in times.items()}


def target_label(target: str) -> str:
    """A target's name in the tables: its vector unit and CPU (``avx2 haswell``)."""
    from kernelrpc.compiler.target import Target
    from kernelrpc.compiler.vector_isa import vector_isa

    parsed = Target(target)
    return f"{vector_isa(parsed).name} {parsed.cpu}"


def tune(name, mod, params, fleet, opts, target):
    """The network tuned on the fleet's device; returns (tuned module, tuning report)."""
    from kernelrpc import autotvm, relay

    tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
    option = autotvm.measure_option(runner=autotvm.RPCRunner(
        "bench-models", fleet.host, fleet.port, number=opts.number, repeat=3))
    log_file = Path(opts.log_dir) / f"{name}-{target_label(target).replace(' ', '-')}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    report = autotvm.tune_tasks(tasks, opts.tune, option, log_file, measure_alone=True)
    print(f"{name}: tuned {len(tasks)} tasks, log {log_file}\n{report}", flush=True)
    with autotvm.apply_history_best(str(log_file)):
        return relay.build(mod, target=target, params=params), report


def main(opts) -> int:
    import numpy as np

    from kernelrpc import relay
    from kernelrpc.contrib import graph_executor
    from kernelrpc.contrib.debugger import debug_executor
    from kernelrpc import rpc
    from kernelrpc.deploy.fleet import LocalFleet
    from kernelrpc.relay.testing import model_input

    threads = [int(t) for t in opts.threads.split(",")]
    fleet = LocalFleet("bench-models")
    rows, tunings, classes = [], [], []
    targets = opts.target or ["llvm"]
    peaks = {target_label(t): fma_peak_gflops(t) for t in targets}
    tvm_done = {}
    try:
        tracker = rpc.connect_tracker(fleet.host, fleet.port)
        with tempfile.TemporaryDirectory() as tmp:
            for name in opts.networks.split(","):
                model = network(name, opts.batch)
                feeds = model_input(model)
                t = time.perf_counter()
                mod, params = relay.frontend.from_onnx(model)
                import_s = time.perf_counter() - t
                for target in targets:
                    label = target_label(target)
                    t = time.perf_counter()
                    lib = relay.build(mod, target=target, params=params)
                    path = lib.export_library(Path(tmp) / f"{name}-{label}.so")
                    build_s = time.perf_counter() - t
                    tuned_path = None
                    if opts.tune:
                        tuned_lib, report = tune(name, mod, params, fleet, opts, target)
                        tunings.append((f"{name} {label}", report))
                        tuned_path = tuned_lib.export_library(Path(tmp) / f"{name}-{label}-tuned.so")
                    tvm_s = None if opts.no_tvm or tvm_done.get(name) else tvm_seconds(model, opts, tmp)
                    tvm_done[name] = tvm_s
                    with tracker.request("bench-models", session_timeout=1800) as remote:
                        remote.upload(str(path))
                        rlib = remote.load_module(path.name)
                        dev = remote.cpu(0)
                        m = graph_executor.GraphModule(rlib["default"](dev))
                        m.set_input(**feeds)
                        tuned = None
                        if tuned_path is not None:
                            remote.upload(str(tuned_path))
                            tuned_rlib = remote.load_module(tuned_path.name)
                            tuned = graph_executor.GraphModule(tuned_rlib["default"](dev))
                            tuned.set_input(**feeds)
                        for n in threads:
                            m.module.set_num_threads(n)
                            ort_session = OrtSession(model, feeds, n)
                            disturbed = []

                            # each turn times its runs after as many untimed ones (a warm-up
                            # of caches and threads after the pause)
                            def kernelrpc_round(module):
                                result = module.benchmark(dev, number=opts.number, repeat=2)
                                disturbed.append(result.disturbed)
                                return result.results[-1]

                            def ort_round():
                                ort_session.seconds(opts.number)
                                return ort_session.seconds(opts.number)
                            timers = {"ours": lambda: kernelrpc_round(m), "theirs": ort_round}
                            if tuned is not None:
                                tuned.module.set_num_threads(n)
                                timers["tuned"] = lambda: kernelrpc_round(tuned)
                            medians = interleaved(opts.repeat, timers)
                            theirs, ref = medians["theirs"], ort_session.output
                            tuned_s = medians.get("tuned")
                            if tuned is not None:
                                tuned.run()
                                tuned_out = tuned.get_output(0).numpy()
                            m.run()
                            got = m.get_output(0).numpy()
                            err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
                            if tuned_s is not None:
                                err = max(err, float(np.abs(tuned_out - ref).max() /
                                                     max(np.abs(ref).max(), 1e-30)))
                            dbg = debug_executor.create(lib.get_graph_json(), rlib, dev)
                            dbg.set_input(**feeds)
                            report = dbg.profile(number=max(1, opts.number // 2), repeat=3)
                            classes.append((name, label, n, "untuned",
                                            class_table(lib.executor["kernels"], report)))
                            if tuned is not None:
                                dbg = debug_executor.create(tuned_lib.get_graph_json(),
                                                            tuned_rlib, dev)
                                dbg.set_input(**feeds)
                                tuned_report = dbg.profile(number=max(1, opts.number // 2), repeat=3)
                                classes.append((name, label, n, "tuned", class_table(
                                    tuned_lib.executor["kernels"], tuned_report)))
                            rows.append([name, label, n, import_s, build_s, path.stat().st_size,
                                         lib.executor["workspace_bytes"], lib.executor["naive_bytes"],
                                         medians["ours"], theirs, err, report.total,
                                         report.end_to_end.median, report.overhead_per_layer,
                                         any(disturbed), tuned_s, tvm_s])
                            print(f"{name} [{label}] threads={n}: kernelrpc {medians['ours'] * 1e3:.2f} ms"
                                  + (f" (tuned {tuned_s * 1e3:.2f} ms)" if tuned_s else "") +
                                  f", onnxruntime {theirs * 1e3:.2f} ms", flush=True)
            tiny = tiny_layers(opts.tiny_layers)
            mod, params = relay.frontend.from_onnx(tiny)
            path = relay.build(mod, params=params).export_library(Path(tmp) / "tiny.so")
            with tracker.request("bench-models", session_timeout=600) as remote:
                remote.upload(str(path))
                rlib = remote.load_module(path.name)
                m = graph_executor.GraphModule(rlib["default"](remote.cpu(0)))
                m.module.set_num_threads(1)
                tiny_run = m.benchmark(remote.cpu(0), number=100, repeat=opts.repeat)
            tiny_ort, _ = ort_seconds(tiny, model_input(tiny), 1, 100, opts.repeat)
    finally:
        fleet.close()
    print()
    print(f"Networks, batch {opts.batch}, float32, median of {opts.repeat} repeats of "
          f"{opts.number} runs; kernelrpc on a device server of this host; TVM: Apache TVM's "
          "untuned build of the same file, when installed")
    header = ["network", "target", "thr", "import s", "build s", "module MB", "arena MB", "naive MB",
              "kernelrpc ms", "onnxruntime ms", "ratio", "tuned ms", "tuned ratio", "TVM ms",
              "max err", "layers ms", "e2e ms", "exec/layer us"]
    table = [header]
    for (name, label, n, imp, bld, size, arena, naive, ours, theirs, err, total, e2e, over,
         disturbed, tuned_s, tvm_s) in rows:
        table.append([name + (" (DISTURBED)" if disturbed else ""), label, str(n), f"{imp:.2f}",
                      f"{bld:.1f}", f"{size / 1e6:.1f}", f"{arena / 1e6:.1f}",
                      f"{naive / 1e6:.1f}", f"{ours * 1e3:.2f}", f"{theirs * 1e3:.2f}",
                      f"{ours / theirs:.2f}x",
                      f"{tuned_s * 1e3:.2f}" if tuned_s else "-",
                      f"{tuned_s / theirs:.2f}x" if tuned_s else "-",
                      f"{tvm_s * 1e3:.2f}" if tvm_s else "-", f"{err:.1e}",
                      f"{total * 1e3:.2f}", f"{e2e * 1e3:.2f}", f"{over * 1e6:.1f}"])
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for k, r in enumerate(table):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    n = opts.tiny_layers
    print(f"\nexecutor: {n} layers of a 16-element reduction, one thread: "
          f"{tiny_run.median * 1e6:.1f} us per run, {tiny_run.median / n * 1e9:.0f} ns per layer "
          f"(kernel call included); onnxruntime {tiny_ort * 1e6:.1f} us, "
          f"{tiny_ort / n * 1e9:.0f} ns per node")
    peak_text = ", ".join(f"{label} {peak:.1f}" for label, peak in peaks.items())
    print(f"\nTime and GFLOP/s per operator class (per-layer profile); one core's measured "
          f"multiply-add peak of each target's code, GFLOP/s: {peak_text} "
          f"(kernelrpc.compiler.peak), times the threads")
    print(f"{'network':<14} {'target':<20} {'thr':>3} {'build':<8} {'class':<15} {'layers':>6} "
          f"{'ms':>8} {'GFLOP/s':>8} {'of peak':>7}")
    for name, label, n, kind, table in classes:
        for cls, (layers, seconds, flops) in table.items():
            if not layers:
                continue
            rate = flops / seconds / 1e9 if seconds and flops else 0.0
            line = (f"{name:<14} {label:<20} {n:>3} {kind:<8} {cls:<15} {layers:>6} "
                    f"{seconds * 1e3:>8.2f} ")
            print(line + (f"{rate:>8.1f} {rate / (peaks[label] * n):>7.0%}" if flops else
                          f"{'-':>8} {'-':>7}"))
    if tunings:
        print(f"\nTuning runs (up to {opts.tune} configurations per task, one device server of "
              "this host, builds on the same cores)")
        print(f"{'network':<14} {'tasks':>5} {'measured':>8} {'built':>5} {'cached':>6} "
              f"{'wall s':>7} {'built/s':>8} {'measured/s':>10} {'held s':>7} {'device idle':>11} "
              f"{'measuring':>9}")
        for name, report in tunings:
            t = report.totals()
            idle = "-" if t["device_idle_fraction"] is None else f"{t['device_idle_fraction']:.0%}"
            share = "-" if t["measuring_share"] is None else f"{t['measuring_share']:.0%}"
            print(f"{name:<14} {t['tasks']:>5} {t['measured']:>8} {t['built']:>5} {t['cached']:>6} "
                  f"{t['wall_seconds']:>7.0f} {t['built_per_second']:>8.2f} "
                  f"{t['measured_per_second']:>10.2f} {t['held_seconds']:>7.0f} {idle:>11} "
                  f"{share:>9}")
    return 0


if __name__ == "__main__":
    options = _parse()
    if options.tvm_worker:
        model_path, number, repeat = options.tvm_worker
        print(json.dumps(tvm_worker(model_path, int(number), int(repeat))))
        sys.exit(0)
    sys.exit(main(options))
