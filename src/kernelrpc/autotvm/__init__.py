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

from types import SimpleNamespace

from . import network, record, space, task, tuner
from .measure_option import LocalBuilder, RPCRunner, measure_option
from .network import tune_tasks
from .record import apply_history_best, load_from_file, log_to_file
from .space import ConfigEntity, ConfigSpace
from .task import Task, get_config, template

callback = SimpleNamespace(log_to_file=log_to_file)
"""TVM's ``autotvm.callback`` namespace."""

__all__ = ["ConfigEntity", "ConfigSpace", "LocalBuilder", "RPCRunner", "Task", "apply_history_best",
           "callback", "get_config", "load_from_file", "log_to_file", "measure_option", "network", "record",
           "space", "task", "template", "tune_tasks", "tuner"]
