"""``python -m kernelrpc.model MODEL.onnx``: import, build, run and profile a whole network on
a device of a tracker (``--tracker HOST:PORT --key KEY``) or here (``--local``).

Prints the model's summary (operators, parameters, FLOPs), the build time, the latency with
its trust report, with ``--profile`` the slowest layers, and, when onnxruntime is installed
here, how closely the device's output agrees with onnxruntime's (max error, top-5 match);
for a quantized model, ``--reference model_fp32.onnx`` adds the quantization error of its
outputs (kernelrpc's and onnxruntime's) against the float network's.
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

from . import cli, model_check

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


def _const_spec(text: str):
    name, sep, values = text.partition("=")
    try:
        numbers = [float(v) if any(c in v for c in ".eEn") else int(v) for v in values.split(",")]
    except ValueError:
        numbers = None
    if not sep or not name or numbers is None:
        raise cli.argparse.ArgumentTypeError(f"--const {text!r}: write NAME=VALUE or "
                                             "NAME=V1,V2,... (for example sr=16000)")
    return name, numbers[0] if len(numbers) == 1 else numbers


def build_parser():
    p = cli.parser("python -m kernelrpc.model", __doc__, silent=False)
    p.add_argument("model", help="the .onnx file")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--tracker", type=cli.host_port, metavar="HOST:PORT",
                       help="request a device of --key from this tracker")
    where.add_argument("--local", action="store_true", help="run here (the default)")
    p.add_argument("--key", default="", help="the device key to request from the tracker")
    p.add_argument("--target", default=None,
                   help="target string to build for (default: what the device says it is)")
    p.add_argument("--threads", type=int, default=0, help="threads on the device (0: all cores)")
    p.add_argument("--input", type=_input_spec, action="append", default=[], metavar="NAME=SHAPE",
                   help="shape of an input with dynamic dimensions (repeatable)")
    p.add_argument("--const", type=_const_spec, action="append", default=[],
                   metavar="NAME=VALUE", help="fix an input to a value at import (repeatable), "
                   "so that what depends on it only (an If on it) is evaluated then")
    p.add_argument("--number", type=int, default=10, help="runs per timed repeat")
    p.add_argument("--repeat", type=int, default=5, help="timed repeats")
    p.add_argument("--profile", action="store_true", help="time every layer")
    p.add_argument("--top", type=int, default=10, help="slowest layers to show with --profile")
    p.add_argument("--output", default=None,
                   help="where the built module goes (default: MODEL.so beside the current "
                        "directory's name of the model)")
    p.add_argument("--session-timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--reference", type=Path, default=None, metavar="FLOAT.onnx",
                   help="for a quantized model: the float network it was quantized from; "
                        "prints the quantization error of the outputs (kernelrpc's and "
                        "onnxruntime's) against it")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    farm = p.add_argument_group("boards and results")
    farm.add_argument("--all-devices", action="store_true",
                      help="measure on every board of --key (several: --key rpi4,rpi5) at once, "
                           "building once per distinct target")
    farm.add_argument("--request-timeout", type=_seconds, default=None, metavar="SECONDS",
                      help="how long to wait for a device of --key (default: until one is free)")
    farm.add_argument("--warmup", type=_count, default=5, metavar="N",
                      help="untimed runs before the timed ones (default: 5)")
    farm.add_argument("--runs", type=_positive, default=50, metavar="N",
                      help="runs timed one by one for the p50/p90/p99 latency (default: 50)")
    farm.add_argument("--db", type=Path, default=None, metavar="PATH",
                      help="the results database (default: results.sqlite in kernelrpc's cache, "
                        "$XDG_CACHE_HOME/kernelrpc)")
    farm.add_argument("--no-db", action="store_true", help="keep no record of this run")
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


MAX_RUNS = 1_000_000


def _number(kind, text: str, low, high, what: str):
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise cli.argparse.ArgumentTypeError(f"{text!r}: give {what}")
    return value


def _positive(text: str) -> int:
    return _number(int, text, 1, MAX_RUNS, f"a positive integer (at most {MAX_RUNS})")


def _count(text: str) -> int:
    return _number(int, text, 0, MAX_RUNS, f"an integer in [0, {MAX_RUNS}]")


def _seconds(text: str) -> float:
    return _number(float, text, 1e-3, 1e6, "a number of seconds in [0.001, 1e6]")


#: the operators counted as a network's layers: its convolutions and dense layers
LAYER_OPS = ("nn.conv2d", "nn.dense", "nn.batch_matmul", "qnn.conv2d", "qnn.dense")


def summarize(mod, params) -> dict:
    from .relay.op import node_flops

    func = mod["main"]
    nodes = func.topo()
    origins = collections.Counter(o for n in nodes for o in n.origin)
    layers = collections.Counter(n.op for n in nodes if n.op in LAYER_OPS)
    return {"inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype}
                       for i in func.inputs],
            "outputs": [{"shape": list(o.shape), "dtype": o.dtype} for o in func.outputs],
            "operators": dict(origins.most_common()),
            "layers": dict(layers.most_common()),
            "parameters": int(sum(v.size for v in params.values())),
            "flops": int(sum(node_flops(n) for n in nodes))}


def _session(args, tracker, key: str | None = None):
    from . import rpc

    if tracker is None:
        return rpc.LocalSession(), "this host"
    host, port = tracker.addr
    key = key or args.key
    return tracker.request(key, session_timeout=args.session_timeout, timeout=args.request_timeout), \
        f"key {key!r} of {host}:{port}"


def _tracker(args, say):
    """The tracker session the command uses: ``--tracker``'s; for ``--tune`` without one, a
    device server and tracker started on loopback; else None (run in this process)."""
    from . import rpc
    from .deploy.fleet import FleetTrackerSession, LocalFleet

    if args.tracker is not None:
        if not args.key:
            raise SystemExit("error: --tracker needs --key (the device key to request)")
        if "," in args.key and not args.all_devices:
            raise SystemExit("error: several keys (--key A,B) need --all-devices")
        return rpc.connect_tracker(*args.tracker)
    if args.all_devices:
        raise SystemExit("error: --all-devices needs --tracker and --key")
    if not args.tune:
        return None
    args.key = args.key or "local"
    fleet = LocalFleet(args.key)
    say(f"devices      no --tracker: tuning on {fleet.describe()}")
    return FleetTrackerSession(fleet)


def _host_feeds(args, model, feeds) -> dict:
    """The inputs of a run on this host: ``feeds`` and the --const inputs."""
    from .relay.frontend.onnx_model import const_input_values

    return {**feeds, **const_input_values(model.graph, dict(args.const), dict(args.input),
                                          "float32")}


def _host_outputs(args, model, feeds) -> tuple:
    """``(expect, floats)``: onnxruntime's outputs and latency on this host (None with
    --no-check) and, with --reference, the float network's outputs, both on the host's inputs
    computed once."""
    if args.no_check and args.reference is None:
        return None, None
    host, threads = _host_feeds(args, model, feeds), args.threads or 0
    expect = None if args.no_check else model_check.onnxruntime_reference(model, host, threads)
    floats = None if args.reference is None else model_check.float_outputs(args.reference, host,
                                                                           threads)
    return expect, floats


def _checks(args, model, outputs, feeds, expect, floats) -> tuple[dict, list[str]]:
    """The board's outputs against onnxruntime's and, with --reference, the float network's."""
    report: dict = {}
    lines: list[str] = []
    if expect is not None:
        report["onnxruntime"] = model_check.agreement(outputs, expect)
        lines += model_check.agreement_lines(report["onnxruntime"])
    if floats is not None:
        report["quantization"] = model_check.quantization_error(args.reference, outputs, floats,
                                                                expect)
        lines += model_check.quantization_lines(report["quantization"])
    return report, lines


def run(args) -> dict:
    from . import relay
    from .display import progress

    say = (lambda *a: None) if args.json else print
    result: dict = {"model": str(args.model)}
    steps = progress(total=4, desc="model", unit="step", enabled=None if not args.json else False)
    t = time.perf_counter()
    model = relay.frontend.onnx_model.load(args.model)
    mod, params = relay.frontend.from_onnx(model, shape=dict(args.input) or None,
                                           const_inputs=dict(args.const))
    result["import_seconds"] = time.perf_counter() - t
    result["summary"] = summarize(mod, params)
    steps.update()
    s = result["summary"]
    say(f"model        {args.model}: {sum(s['operators'].values())} operators "
        f"({', '.join(f'{k} {v}' for k, v in list(s['operators'].items())[:8])}"
        f"{', ...' if len(s['operators']) > 8 else ''}), {s['parameters']:,} parameters, "
        f"{s['flops'] / 1e9:.3f} GFLOP per run; imported in {result['import_seconds']:.2f} s")
    if any(op.startswith("qnn.") for op in s["layers"]):
        say(f"int8         {sum(v for k, v in s['layers'].items() if k.startswith('qnn.'))} of "
            f"{sum(s['layers'].values())} conv/dense layers in integers "
            f"({', '.join(f'{k} {v}' for k, v in s['layers'].items())})")
    tracker = _tracker(args, say)
    try:
        if args.all_devices:
            steps.close()
            _run_on_all_devices(args, model, mod, params, tracker, result, say)
        else:
            _run_on_device(args, model, mod, params, tracker, result, steps, say)
    finally:
        if tracker is not None:
            tracker.close()
    if not args.no_db:
        result["db"] = _record(args, result)
        say(f"recorded     {len(result['db']['rows'])} result(s) in {result['db']['path']}")
    if not args.json:
        paths = [m["path"] for m in result.get("modules", ())]
        cli.report_output("kernelrpc model", f"module{'s' * (len(paths) > 1)} at {', '.join(paths)}",
                          "kernelrpc.model", args.argv)
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


def _build_module(args, mod, params, target, output: Path, say):
    """Build for ``target`` and export to ``output``: the library and what the module is."""
    t = time.perf_counter()
    lib = _build(args, mod, params, target)
    lib.export_library(output)
    module = {"path": str(output), "bytes": output.stat().st_size,
              "sha256": _sha256(output), "target": lib.target.to_dict().get("string"),
              "kernels": len(lib.executor["kernels"]),
              "arena_bytes": lib.executor["workspace_bytes"],
              "naive_bytes": lib.executor["naive_bytes"], "build_seconds": time.perf_counter() - t}
    say(f"built        {module['kernels']} kernel calls for {module['target']} in "
        f"{module['build_seconds']:.2f} s -> {output} ({module['bytes'] / 1e6:.1f} MB; activations "
        f"{module['arena_bytes'] / 1e6:.2f} MB planned, {module['naive_bytes'] / 1e6:.2f} MB unplanned)")
    if args.log:
        module["schedules"] = _schedules(lib, say)
    return lib, module


def _sha256(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _feeds(summary: dict) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    return {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in summary["inputs"]}


def _board_report(remote, reset_peak: bool = False) -> dict:
    """The device's ``runtime.board_report``; from a server that predates it, its description
    alone (``state`` empty)."""
    from .errors import RemoteError

    try:
        return json.loads(remote.get_function("runtime.board_report")(int(reset_peak)))
    except (RemoteError, LookupError):
        facts = remote.device_info() if hasattr(remote, "device_info") else {}
        return {"facts": facts, "state": {}}


def _measure(args, remote, lib, module: dict, feeds: dict, where: str):
    """Load the built module on one board, run it once for its outputs, warm it up, time it:
    ``(board, outputs, lines)``, ``board`` with what the board is and its state before and
    after the run, ``lines`` its table to print."""
    from .contrib import graph_executor
    from .results import trust

    before = _board_report(remote, reset_peak=True)
    output = Path(module["path"])
    remote.upload(str(output))
    rlib = remote.load_module(output.name)
    dev = remote.cpu(0)
    m = graph_executor.GraphModule(rlib["default"](dev))
    if args.threads:
        m.module.set_num_threads(args.threads)
    m.set_input(**feeds)
    m.run()
    outputs = [m.get_output(k).numpy() for k in range(m.get_num_outputs())]
    if args.warmup:
        m.benchmark(dev, number=args.warmup, repeat=1)
    bench = m.benchmark(dev, number=args.number, repeat=args.repeat)
    one_by_one = m.benchmark(dev, number=1, repeat=args.runs)
    lines = []
    profile = _profile(args, lib, rlib, dev, feeds, lines) if args.profile else None
    after = _board_report(remote)
    facts = before["facts"]
    address = getattr(remote, "address", "local")
    board = {"board": f"local:{facts.get('hostname', '')}" if address == "local" else address,
             "where": where, "facts": facts, "target": module["target"], "build_sha256": module["sha256"],
             "state": {"before": before["state"], "after": after["state"]},
             "peak_rss_bytes": after["state"].get("peak_rss_bytes"),
             "latency": bench.to_dict(), "median": bench.median, "warmup": args.warmup, "runs": args.runs,
             **trust.percentiles(one_by_one.results),
             "flags": trust.flags(facts, before["state"], after["state"], bench.disturbance())}
    if profile is not None:
        board["profile"] = profile
    return board, outputs, _board_lines(board, bench) + lines


def _board_lines(board: dict, bench) -> list[str]:
    from .display import format_time
    from .results import trust

    f, state = board["facts"], board["state"]
    versions = " / ".join(f"{name} {f[key]}" for name, key in
                          (("Linux", "kernel"), ("Python", "python"), ("kernelrpc", "kernelrpc")) if key in f)
    lines = [f"ran on       {board['where']}, board {board['board']}",
             (f"board        {f.get('cpu_model') or f.get('machine', '?')}, {f.get('cpus', '?')} cores, "
              f"{f.get('machine', '?')}{'' if not f.get('emulated') else ' (emulated)'}; {versions}"),
             f"             built for {board['target']}",
             f"state        before: {trust.state_text(state['before'])}",
             f"             after:  {trust.state_text(state['after'])}",
             str(bench.table()),
             (f"latency      p50 {format_time(board['p50'])}, p90 {format_time(board['p90'])}, "
              f"p99 {format_time(board['p99'])} over {board['runs']} runs timed one by one after "
              f"{board['warmup']} warm-up runs")]
    if board["peak_rss_bytes"]:
        since = board["state"]["before"].get("peak_rss_since")
        lines.append(f"memory       peak resident {board['peak_rss_bytes'] / 1e6:.1f} MB in the session "
                     + ("during the run" if since == "reset" else "since the session started"))
    lines += [f"WARNING      {flag}" for flag in board["flags"]]
    return lines


def _profile(args, lib, rlib, dev, feeds, lines: list) -> dict:
    from .contrib.debugger import debug_executor

    dbg = debug_executor.create(lib.get_graph_json(), rlib, dev)
    dbg.set_input(**feeds)
    report = dbg.profile(number=args.number, repeat=max(1, min(args.repeat, 3)))
    lines.append(str(report.table(report.slowest(args.top))).replace(
        "Per-layer profile", f"Slowest {min(args.top, len(report.rows))} layers of the "
        "per-layer profile"))
    return {"layers": report.rows, "sum_seconds": report.total,
            "end_to_end_seconds": report.end_to_end.median,
            "overhead_per_layer_seconds": report.overhead_per_layer}


def _output_path(args, index: int = 0, count: int = 1) -> Path:
    path = Path(args.output or Path(args.model).with_suffix(".so").name)
    if count > 1:
        path = path.with_name(f"{path.stem}-{index}{path.suffix}")
    return path.resolve()


def _run_on_device(args, model, mod, params, tracker, result, steps, say):
    from .display import format_time

    s = result["summary"]
    if args.tune:
        target = _target_of(args, tracker)
        result["tuning"] = _tune(args, mod, params, tracker, target, say)
    remote, where = _session(args, tracker)
    with remote:
        target = args.target or (remote.target() if hasattr(remote, "target") else None)
        lib, module = _build_module(args, mod, params, target, _output_path(args), say)
        result["modules"] = [module]
        steps.update()
        feeds = _feeds(s)
        board, outputs, lines = _measure(args, remote, lib, module, feeds, where)
        steps.update(2)
        steps.close()
        result["device"] = where
        for line in lines:
            say(line)
        expect, floats = _host_outputs(args, model, feeds)
        checks, lines = _checks(args, model, outputs, feeds, expect, floats)
        board.update(checks)
        for line in lines:
            say(line)
        result["boards"] = [board]
        if args.tune:
            untuned = _untuned_latency(args, mod, params, target, remote, remote.cpu(0), feeds)
            result["untuned_latency"] = untuned.to_dict()
            say(f"untuned      {format_time(untuned.median)} median in the same session: "
                f"tuned is {untuned.median / board['median']:.2f}x as fast")
        result.update(module=module, build_seconds=module["build_seconds"], latency=board["latency"],
                      **{name: board[name] for name in ("onnxruntime", "quantization", "profile")
                         if name in board})
        if "schedules" in module:
            result["schedules"] = module["schedules"]
        say(f"latency      {format_time(board['median'])} median")


def _run_on_all_devices(args, model, mod, params, tracker, result, say):
    """Every board of the keys at once: one session each, one build per distinct target."""
    from . import farm

    if args.tune:
        raise SystemExit("error: --all-devices measures; tune first, then measure with --log")
    keys = farm.keys_of(args.key)
    feeds = _feeds(result["summary"])
    expect, floats = _host_outputs(args, model, feeds)
    built: dict = {}

    def build(target, index, count):
        built[target] = _build_module(args, mod, params, target, _output_path(args, index, count), say)
        return built[target]

    def measure(board: farm.Board, artifact):
        lib, module = artifact
        measured, outputs, lines = _measure(args, board.remote, lib, module, feeds,
                                            f"key {board.key!r} of {tracker.where}")
        measured["key"] = board.key
        checks, check_lines = _checks(args, model, outputs, feeds, expect, floats)
        measured.update(checks)
        return measured, lines + check_lines

    with farm.open_boards(tracker, keys, session_timeout=args.session_timeout,
                          request_timeout=args.request_timeout) as boards:
        say(f"boards       {len(boards)} on key{'s' * (len(keys) > 1)} {', '.join(keys)}: "
            + ", ".join(b.address for b in boards))
        outcomes = farm.measure_all(boards, lambda b: args.target or b.remote.target(), build, measure)
    result["modules"] = [module for _, module in built.values()]
    result["boards"] = []
    for board, outcome in outcomes:
        if isinstance(outcome, Exception):
            result["boards"].append({"board": board.address, "key": board.key,
                                     "error": f"{type(outcome).__name__}: {outcome}"})
            say(f"\nboard {board.address} (key {board.key!r}) FAILED: {outcome}")
            continue
        measured, lines = outcome
        result["boards"].append(measured)
        say("")
        for line in lines:
            say(line)
    say("")
    say(str(farm.comparison([b for b in result["boards"] if "error" not in b])))


def _record(args, result) -> dict:
    """One row per measured board in the results database: ``{"path", "run", "rows"}``."""
    import uuid

    from .results import store

    path = args.db or store.default_path()
    run, model_hash, rows = uuid.uuid4().hex, _sha256(args.model), []
    conn = store.open_db(path)
    try:
        for board in result["boards"]:
            if "error" in board:
                continue
            check = board.get("onnxruntime", {})
            errors = [o["relative"] for o in check.get("outputs", ())]
            facts = board["facts"]
            rows.append(store.insert(conn, {
                "run": run, "model": Path(args.model).name[:store.MAX_TEXT], "model_hash": model_hash,
                "build_hash": board["build_sha256"], "target": board["target"], "key": board.get("key", args.key),
                "board": board["board"], "machine": facts.get("machine"), "cpu_model": facts.get("cpu_model"),
                "cpus": facts.get("cpus"), "emulated": bool(facts.get("emulated")),
                "p50": board["p50"], "p90": board["p90"], "p99": board["p99"], "runs": board["runs"],
                "peak_rss_bytes": board["peak_rss_bytes"], "max_relative_error": max(errors, default=None),
                "flags": board["flags"], "facts": facts, "state": board["state"]}))
    finally:
        conn.close()
    return {"path": str(path), "run": run, "rows": rows}


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
