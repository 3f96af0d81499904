"""Tune a whole network on a device of a tracker: TVM's "Auto-tuning a convolutional network"
tutorial (``tune_relay_x86.py`` / ``tune_relay_arm.py``) with the import lines changed.

The network's convolutions and dense layers become tasks (``extract_from_program``), each is
tuned on every free device of ``--key`` with one of AutoTVM's tuners, every measurement goes
to ``--log`` (run again to continue where it stopped), and the network is built with the best
configuration of each task and timed on the device beside the untuned build. The network is
an ONNX file (``--model``) or, by default, a ResNet-18 built in code. Without a tracker at
``--tracker`` (default ``$KERNELRPC_TRACKER``, else 127.0.0.1:9190) a local tracker and device
server are started for the run.

Run::

    PYTHONPATH=src python examples/tune_network.py --trials 32      # a local fleet if no tracker
    PYTHONPATH=src python examples/tune_network.py --tracker 10.0.0.5:9190 --key rpi4 \\
        --model resnet18.onnx --trials 200 --log resnet18-rpi4.log
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from kernelrpc import autotvm, relay
from kernelrpc.cli import host_port
from kernelrpc.contrib import graph_executor
from kernelrpc.deploy.fleet import connect_or_start


def get_network(args):
    import onnx

    from kernelrpc.relay import testing

    model = onnx.load(args.model) if args.model else \
        testing.resnet18(size=args.size, width=args.width, classes=1000)
    mod, params = relay.frontend.from_onnx(model)
    return model, mod, params


def tune_tasks(tasks, measure_option, tuner, n_trial, early_stopping, log_filename):
    """The tutorial's loop: each task with its own tuner, resumed from the log."""
    history = autotvm.load_from_file(log_filename) if os.path.exists(log_filename) else []
    for i, task in enumerate(tasks):
        prefix = f"[Task {i + 1:2d}/{len(tasks):2d}] {task.name} x{task.layers}"
        tuner_obj = {"ga": autotvm.tuner.GATuner, "model": autotvm.tuner.ModelTuner,
                     "random": autotvm.tuner.RandomTuner,
                     "gridsearch": autotvm.tuner.GridSearchTuner}[tuner](task)
        done = tuner_obj.load_history(history)
        todo = min(n_trial, len(task.config_space)) - done
        if todo > 0:
            tuner_obj.tune(n_trial=todo, early_stopping=early_stopping,
                           measure_option=measure_option, confirm=3,
                           callbacks=[autotvm.callback.log_to_file(log_filename)])
        best = tuner_obj.best_seconds
        default = tuner_obj.default_seconds
        print(f"{prefix}: {done} logged + {tuner_obj.trials} measured, best {best * 1e3:.3f} ms"
              + (f", default {default * 1e3:.3f} ms" if default else ""), flush=True)


def evaluate(remote, lib, feeds, name):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.so"
        lib.export_library(path)
        remote.upload(str(path))
    dev = remote.cpu(0)
    module = graph_executor.GraphModule(remote.load_module(path.name)["default"](dev))
    module.set_input(**feeds)
    result = module.benchmark(dev, number=5, repeat=3)
    module.run()
    return result, module.get_output(0).numpy()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tracker", type=host_port, metavar="HOST:PORT",
                   default=os.environ.get("KERNELRPC_TRACKER", "127.0.0.1:9190"))
    p.add_argument("--key", default="tune-network")
    p.add_argument("--model", default=None, help="an ONNX file (default: ResNet-18 built in code)")
    p.add_argument("--size", type=int, default=224, help="input size of the built-in ResNet-18")
    p.add_argument("--width", type=float, default=1.0, help="width of the built-in ResNet-18")
    p.add_argument("--trials", type=int, default=32, help="configurations per task")
    p.add_argument("--tuner", default="ga", choices=["ga", "model", "random", "gridsearch"])
    p.add_argument("--early-stopping", type=int, default=None)
    p.add_argument("--log", default="tune_network.log")
    p.add_argument("--request-timeout", type=float, default=None, metavar="SECONDS",
                   help="give up waiting for a board of --key after this long")
    args = p.parse_args(argv)

    model, mod, params = get_network(args)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in mod["main"].inputs}
    with connect_or_start(*args.tracker, args.key) as tracker:
        with tracker.request(args.key, timeout=args.request_timeout) as remote:
            target = remote.target()
        print("Extract tasks...")
        tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
        print(f"{len(tasks)} tasks for {sum(t.layers for t in tasks)} layers")
        host, port = tracker.addr
        measure_option = autotvm.measure_option(
            runner=autotvm.RPCRunner(args.key, host, port, number=5, repeat=3))
        print("Tuning...")
        tune_tasks(tasks, measure_option, args.tuner, args.trials, args.early_stopping, args.log)

        print("Compile...")
        untuned = relay.build(mod, target=target, params=params)
        with autotvm.apply_history_best(args.log, target=target):
            tuned = relay.build(mod, target=target, params=params)
        with tracker.request(args.key, timeout=args.request_timeout) as remote:
            before, _ = evaluate(remote, untuned, feeds, "untuned")
            after, out = evaluate(remote, tuned, feeds, "tuned")
    print("Evaluate inference time cost...")
    print(f"untuned: mean {before.mean * 1e3:.2f} ms (std {before.std * 1e3:.2f} ms)")
    print(f"tuned:   mean {after.mean * 1e3:.2f} ms (std {after.std * 1e3:.2f} ms)")
    print(f"output checksum {float(np.abs(out).sum()):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
