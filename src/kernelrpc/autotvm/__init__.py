"""Schedule tuning in the spirit of AutoTVM: templates with knobs, search, a resumable log.

::

    @autotvm.template("gemm")
    def gemm(M, N, K):
        cfg = autotvm.get_config()
        cfg.define_split("tile_x", N, num_outputs=2)
        ...
        return s, [A, B, C]

    task = autotvm.task.create("gemm", args=(M, N, K), reference=lambda a, b: a @ b, flop=2*M*N*K)
    tuner = autotvm.tuner.GATuner(task)
    tuner.tune(200, autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", 9190)),
               callbacks=[autotvm.callback.log_to_file("gemm.log")])
    with autotvm.apply_history_best("gemm.log"):
        s, args = gemm(M, N, K)

A network's layers are tasks too: ``autotvm.task.extract_from_program(mod["main"], target,
params)``, ``autotvm.tune_tasks(...)``, then ``relay.build`` inside ``apply_history_best``.

See docs/measure.md and docs/models.md.
"""
from __future__ import annotations

import importlib

from . import space, task
from .space import ConfigEntity, ConfigSpace
from .task import Task, get_config, template

#: names loaded on first use: the tuners, the log and the measurement options bring in the
#: measurement side (``kernelrpc.measure``), which building a network does not need
_LAZY = {"network": ("network", None), "record": ("record", None), "tuner": ("tuner", None),
         "LocalBuilder": ("measure_option", "LocalBuilder"),
         "RPCRunner": ("measure_option", "RPCRunner"),
         "measure_option": ("measure_option", "measure_option"),
         "tune_tasks": ("network", "tune_tasks"),
         "apply_history_best": ("record", "apply_history_best"),
         "load_from_file": ("record", "load_from_file"),
         "log_to_file": ("record", "log_to_file")}


def __getattr__(name: str):
    if name == "callback":
        from types import SimpleNamespace

        value = SimpleNamespace(log_to_file=__getattr__("log_to_file"))
    elif name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(f"{__name__}.{module_name}")
        value = module if attribute is None else getattr(module, attribute)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["ConfigEntity", "ConfigSpace", "LocalBuilder", "RPCRunner", "Task", "apply_history_best",
           "callback", "get_config", "load_from_file", "log_to_file", "measure_option", "network", "record",
           "space", "task", "template", "tune_tasks", "tuner"]
