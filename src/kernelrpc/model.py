"""``python -m kernelrpc.model MODEL.onnx``: import, build, run and profile a whole network on
a device of a tracker (``--tracker HOST:PORT --key KEY``) or here (``--local``).

Prints the model's summary (operators, parameters, FLOPs), the build time, the latency with
its trust report, with ``--profile`` the slowest layers, and, when onnxruntime is installed
here, how closely the device's output agrees with onnxruntime's (max error, top-5 match).
``--json`` prints one JSON document instead, for scripts.

``--tune TRIALS --log FILE`` first tunes the network's convolutions and dense layers on the
devices of the key (AutoTVM's flow: one task per distinct layer, up to TRIALS configurations
each, every measurement appended to FILE, so that a second run continues where the first
stopped), then builds with the best configuration of each task and times the network untuned
and tuned in the same session. Without ``--tracker`` it tunes on a device server started here.

Examples:
    python -m kernelrpc.model resnet18.onnx --local --profile
    python -m kernelrpc.model net.onnx --tracker 10.0.0.5:9190 --key rpi4 --input data=1,3,224,224
    python -m kernelrpc.model r18.onnx --tracker 10.0.0.5:9190 --key rpi4 --tune 64 --log r18.log
"""
from __future__ import annotations

import collections
import json
import logging
import sys
import time
from pathlib import Path

from . import cli

log = logging.getLogger("kernelrpc.model")


def _input_spec(text: str):
    name, sep, shape = text.rpartition("=")
    if not sep or not name:
        raise cli.argparse.ArgumentTypeError(f"--input {text!r}: write NAME=D1,D2,... "
                                             "(for example data=1,3,224,224)")
    try:
        dims = tuple(int(d) for d in shape.replace("x", ",").split(","))
    except ValueError:
        raise cli.argparse.ArgumentTypeError(f"--input {text!r}: the shape must be integers") \
            from None
    return name, dims


def _tracker_address(text: str):
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise cli.argparse.ArgumentTypeError(f"--tracker {text!r}: write HOST:PORT")
    return host or "127.0.0.1", int(port)


def build_parser():
    p = cli.parser("python -m kernelrpc.model", __doc__, silent=False)
    p.add_argument("model", help="the .onnx file")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--tracker", type=_tracker_address, metavar="HOST:PORT",
                       help="request a device of --key from this tracker")
    where.add_argument("--local", action="store_true", help="run here (the default)")
    p.add_argument("--key", default="", help="the device key to request from the tracker")
    p.add_argument("--target", default=None,
                   help="target string to build for (default: what the device says it is)")
    p.add_argument("--threads", type=int, default=0, help="threads on the device (0: all cores)")
    p.add_argument("--input", type=_input_spec, action="append", default=[], metavar="NAME=SHAPE",
                   help="shape of an input with dynamic dimensions (repeatable)")
    p.add_argument("--number", type=int, default=10, help="runs per timed repeat")
    p.add_argument("--repeat", type=int, default=5, help="timed repeats")
    p.add_argument("--profile", action="store_true", help="time every layer")
    p.add_argument("--top", type=int, default=10, help="slowest layers to show with --profile")
    p.add_argument("--output", default=None,
                   help="where the built module goes (default: MODEL.so beside the current "
                        "directory's name of the model)")
    p.add_argument("--session-timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    tune = p.add_argument_group("tuning")
    tune.add_argument("--tune", type=_positive, default=0, metavar="TRIALS",
                      help="tune every task up to TRIALS configurations before building")
    tune.add_argument("--log", default=None, metavar="FILE",
                      help="the tuning log (JSON lines): read to resume, appended to; with "
                           "--tune, or alone to build with its best configurations")
    tune.add_argument("--tuner", default="ga", choices=["ga", "model", "random", "grid"],
                      help="search strategy (default: ga)")
    tune.add_argument("--early-stopping", type=_positive, default=None, metavar="N",
                      help="stop a task after N trials without a faster configuration")
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise cli.argparse.ArgumentTypeError(f"{text!r}: give a positive integer")
    return value


def summarize(mod, params) -> dict:
    from .relay.op import node_flops

    func = mod["main"]
    nodes = func.topo()
    origins = collections.Counter(o for n in nodes for o in n.origin)
    return {"inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                       for i in func.inputs],
            "outputs": [{"shape": list(o.shape), "dtype": o.dtype} for o in func.outputs],
            "operators": dict(origins.most_common()),
            "parameters": int(sum(v.size for v in params.values())),
            "flops": int(sum(node_flops(n) for n in nodes))}


def _session(args, tracker):
    from . import rpc

    if tracker is None:
        return rpc.LocalSession(), "this host"
    host, port = tracker.addr
    return tracker.request(args.key, session_timeout=args.session_timeout), \
        f"key {args.key!r} of {host}:{port}"


def _tracker(args, say):
    """The tracker session the command uses: ``--tracker``'s; for ``--tune`` without one, a
    device server and tracker started on loopback; else None (run in this process)."""
    from . import rpc
    from .deploy.fleet import FleetTrackerSession, LocalFleet

    if args.tracker is not None:
        if not args.key:
            raise SystemExit("error: --tracker needs --key (the device key to request)")
        return rpc.connect_tracker(*args.tracker)
    if not args.tune:
        return None
    args.key = args.key or "local"
    fleet = LocalFleet(args.key)
    say(f"devices      no --tracker: tuning on {fleet.describe()}")
    return FleetTrackerSession(fleet)


def _agreement(model, feeds, outputs, threads) -> dict:
    import numpy as np

    try:
        import onnxruntime as ort
    except ImportError:
        return {"checked": False, "why": "onnxruntime is not installed here"}
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(threads, 1) if threads else 0
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    expect = session.run(None, feeds)
    report = {"checked": True, "outputs": []}
    for got, ref in zip(outputs, expect):
        scale = float(np.abs(ref).max()) or 1.0
        entry = {"max_abs_error": float(np.abs(got - ref).max()),
                 "relative": float(np.abs(got - ref).max()) / scale}
        if ref.ndim == 2 and ref.shape[1] >= 5:
            top_got = np.argsort(-got, axis=1)[:, :5]
            top_ref = np.argsort(-ref, axis=1)[:, :5]
            entry["top5_match"] = bool((top_got == top_ref).all())
        report["outputs"].append(entry)
    return report


def run(args) -> dict:
    from . import relay
    from .display import progress

    say = (lambda *a: None) if args.json else print
    result: dict = {"model": str(args.model)}
    steps = progress(total=4, desc="model", unit="step", enabled=None if not args.json else False)
    t = time.perf_counter()
    model = relay.frontend.onnx_model.load(args.model)
    mod, params = relay.frontend.from_onnx(model, shape=dict(args.input) or None)
    result["import_seconds"] = time.perf_counter() - t
    result["summary"] = summarize(mod, params)
    steps.update()
    s = result["summary"]
    say(f"model        {args.model}: {sum(s['operators'].values())} operators "
        f"({', '.join(f'{k} {v}' for k, v in list(s['operators'].items())[:8])}"
        f"{', ...' if len(s['operators']) > 8 else ''}), {s['parameters']:,} parameters, "
        f"{s['flops'] / 1e9:.3f} GFLOP per run; imported in {result['import_seconds']:.2f} s")
    tracker = _tracker(args, say)
    try:
        _run_on_device(args, model, mod, params, tracker, result, steps, say)
    finally:
        if tracker is not None:
            tracker.close()
    return result


def _target_of(args, tracker):
    if args.target:
        return args.target
    with _session(args, tracker)[0] as remote:
        return remote.target() if hasattr(remote, "target") else None


def _tune(args, mod, params, tracker, target, say) -> dict:
    from . import autotvm

    tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
    say(f"tuning       {len(tasks)} tasks ({sum(t.layers for t in tasks)} layers), up to "
        f"{args.tune} configurations each, on key {args.key!r}; log {args.log}")
    host, port = tracker.addr
    option = autotvm.measure_option(runner=autotvm.RPCRunner(
        args.key, host, port, number=args.number, repeat=3,
        session_timeout=args.session_timeout))
    report = autotvm.tune_tasks(tasks, args.tune, option, args.log, tuner=args.tuner,
                                early_stopping=args.early_stopping,
                                measure_alone=args.tracker is None)    # a fleet of this host
    say(report.table())
    return {**report.totals(),
            "tasks": [{"workload": [t.task.name, *t.task.args], "layers": t.task.layers,
                       "resumed": t.resumed, "measured": t.measured,
                       "default_seconds": t.default_seconds, "best_seconds": t.best_seconds,
                       "best_gflops": t.best_gflops} for t in report.tasks]}


def _build(args, mod, params, target):
    from . import autotvm, relay

    if not args.log:
        return relay.build(mod, target=target, params=params)
    with autotvm.apply_history_best(args.log):
        return relay.build(mod, target=target, params=params)


def _run_on_device(args, model, mod, params, tracker, result, steps, say):
    import numpy as np

    from .contrib import graph_executor
    from .contrib.debugger import debug_executor
    from .display import format_time

    s = result["summary"]
    if args.tune:
        target = _target_of(args, tracker)
        result["tuning"] = _tune(args, mod, params, tracker, target, say)
    remote, where = _session(args, tracker)
    with remote:
        target = args.target or (remote.target() if hasattr(remote, "target") else None)
        t = time.perf_counter()
        lib = _build(args, mod, params, target)
        output = Path(args.output or Path(args.model).with_suffix(".so").name).resolve()
        lib.export_library(output)
        result["build_seconds"] = time.perf_counter() - t
        result["module"] = {"path": str(output), "bytes": output.stat().st_size,
                            "target": lib.target.to_dict().get("string"),
                            "kernels": len(lib.executor["kernels"]),
                            "arena_bytes": lib.executor["workspace_bytes"],
                            "naive_bytes": lib.executor["naive_bytes"]}
        steps.update()
        say(f"built        {result['module']['kernels']} kernel calls for "
            f"{result['module']['target']} in {result['build_seconds']:.2f} s -> {output} "
            f"({output.stat().st_size / 1e6:.1f} MB; activations {lib.executor['workspace_bytes'] / 1e6:.2f} MB "
            f"planned, {lib.executor['naive_bytes'] / 1e6:.2f} MB unplanned)")
        if args.log:
            result["schedules"] = _schedules(lib, say)
        remote.upload(str(output))
        rlib = remote.load_module(output.name)
        dev = remote.cpu(0)
        m = graph_executor.GraphModule(rlib["default"](dev))
        if args.threads:
            m.module.set_num_threads(args.threads)
        rng = np.random.default_rng(0)
        feeds = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"])
                 for i in s["inputs"]}
        m.set_input(**feeds)
        m.run()
        outputs = [m.get_output(k).numpy() for k in range(m.get_num_outputs())]
        steps.update()
        bench = m.benchmark(dev, number=args.number, repeat=args.repeat)
        result["latency"] = bench.to_dict()
        result["device"] = where
        say(f"ran on       {where}")
        say(str(bench.table()))
        if args.profile:
            dbg = debug_executor.create(lib.get_graph_json(), rlib, dev)
            dbg.set_input(**feeds)
            report = dbg.profile(number=args.number, repeat=max(1, min(args.repeat, 3)))
            result["profile"] = {"layers": report.rows, "sum_seconds": report.total,
                                 "end_to_end_seconds": report.end_to_end.median,
                                 "overhead_per_layer_seconds": report.overhead_per_layer}
            say(str(report.table(report.slowest(args.top))).replace(
                "Per-layer profile", f"Slowest {min(args.top, len(report.rows))} layers of the "
                "per-layer profile"))
        steps.update()
        steps.close()
        if not args.no_check:
            result["onnxruntime"] = _agreement(model, feeds, outputs, args.threads)
            check = result["onnxruntime"]
            if check["checked"]:
                for k, entry in enumerate(check["outputs"]):
                    top5 = "" if "top5_match" not in entry else \
                        f", top-5 {'matches' if entry['top5_match'] else 'DIFFERS'}"
                    say(f"onnxruntime  output {k}: max error {entry['max_abs_error']:.3g} "
                        f"({entry['relative']:.2g} of its scale){top5}")
            else:
                say(f"onnxruntime  not compared: {check['why']}")
        if args.tune:
            untuned = _untuned_latency(args, mod, params, target, remote, dev, feeds)
            result["untuned_latency"] = untuned.to_dict()
            say(f"untuned      {format_time(untuned.median)} median in the same session: "
                f"tuned is {untuned.median / bench.median:.2f}x as fast")
        say(f"latency      {format_time(bench.median)} median")
        if not args.json:
            cli.report_output("kernelrpc model", f"module at {output}", "kernelrpc.model",
                              args.argv)


def _schedules(lib, say) -> dict:
    """Which layers got a tuned configuration and which kept the default schedule."""
    kernels = lib.executor["kernels"]
    tuned = [k["name"] for k in kernels if k["schedule"] == "tuned"]
    default = [k["name"] for k in kernels if k["schedule"] == "default"]
    say(f"schedules    {len(tuned)} of {len(tuned) + len(default)} tunable layers tuned"
        + (f"; on the default schedule: {', '.join(default)}" if default else ""))
    return {"tuned": tuned, "default": default}


def _untuned_latency(args, mod, params, target, remote, dev, feeds):
    import tempfile

    from . import relay
    from .contrib import graph_executor

    lib = relay.build(mod, target=target, params=params)
    with tempfile.TemporaryDirectory(prefix="kernelrpc-model-") as tmp:
        path = Path(tmp) / "untuned.so"
        lib.export_library(path)
        remote.upload(str(path))
    m = graph_executor.GraphModule(remote.load_module(path.name)["default"](dev))
    if args.threads:
        m.module.set_num_threads(args.threads)
    m.set_input(**feeds)
    return m.benchmark(dev, number=args.number, repeat=args.repeat)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tune and not args.log:
        parser.error("--tune needs --log FILE (where the measurements go)")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    cli.setup_logging(args)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    return 0


def command() -> int:
    """The console script: :func:`main` with its errors as one line (cli.run_main)."""
    return cli.run_main("kernelrpc.model", main)


if __name__ == "__main__":
    sys.exit(command())
