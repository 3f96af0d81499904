"""``relay.build``: a network graph to one module that runs the whole network natively.

The graph is optimized (:mod:`.transform`), cut into fused groups (:mod:`.fuse`), each group
scheduled (:mod:`.schedule`) and lowered to a kernel; groups that are the same computation on
tensors of the same shapes share one kernel. The memory plan (:mod:`.memory_plan`) places every
value; the network's entry points are C (:mod:`.executor_codegen`) compiled for the target.
The metadata carries the executor's plan (``"executor"``) and TVM's graph JSON (``"graph"``),
so ``module["default"](dev)`` makes a graph executor on any device that loads the file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import logging
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from .. import compiler
from ..autotvm.task import current_context
from ..compiler.build import BuiltModule, LinkInputs, RunsHere, link_module
from ..compiler.lower import PassContext, lower
from ..compiler.target import Target
from ..runtime import calling_convention as convention
from ..runtime.calling_convention import KernelCall, entry_functions
from . import ir
from .errors import ModelError
from .executor_codegen import entry_source, params_source
from . import transform
from .fuse import Group, partition
from .graph_json import graph_json
from .memory_plan import concats_in_place, plan_memory
from .op import OPS
from .schedule import group_tensors, schedule_group
from .strategy import strategy_for, tiles_for
from .transform import optimize, with_layout
from .tuning import LAID_OUT, int8_forms, layer_config

log = logging.getLogger("kernelrpc.relay")
#: the graph JSON's kernel of a node that runs nothing (TVM's graph executor's name for it)
NOP = "__nop"


def build(mod, target=None, params=None, *, target_host=None, mod_name: str = "default"):
    """Compile a network (TVM's ``relay.build``); returns a
    :class:`GraphExecutorFactoryModule` (``export_library``, ``get_graph_json``,
    ``get_params``, ``["default"]``)."""
    if mod_name != "default":
        raise ValueError("mod_name: only 'default' is supported")
    func = mod["main"] if isinstance(mod, ir.IRModule) else mod
    if not isinstance(func, ir.Function):
        raise TypeError(f"relay.build takes the IRModule from_onnx returned, got "
                        f"{type(mod).__name__}")
    target = Target(target if target is not None else target_host)
    started = time.perf_counter()
    tiles = tiles_for(target)
    func = _outputs_computed(int8_forms(optimize(func, params), tiles))
    func, configs = _pack_weights(func, target, tiles)
    groups = partition(func)
    in_place = concats_in_place(groups, func.outputs)
    plan = plan_memory(groups, func.inputs, func.outputs, in_place)
    kernels, names, calls, records = {}, [], [], []
    primfuncs = []
    for group in groups:
        if id(group) in in_place:
            names.append(NOP)          # its producers wrote it: no call, TVM's "__nop" node
            continue
        key = _signature(group)
        cfg, how, workload = configs.get(id(group.anchor)) or layer_config(group, target)
        if key not in kernels:
            fname = f"k{len(kernels)}_{group.kind[6:]}"[:200]
            placeholders, out, anchor = group_tensors(group)
            s = schedule_group(group, out, anchor, tiles, cfg)
            with _bound_checks(group):
                primfuncs.append(lower(s, placeholders + [out], name=fname))
            kernels[key] = fname
        fname = kernels[key]
        names.append(fname)
        locations = [plan.locations[id(i)] for i in group.inputs()] + \
            [plan.locations[id(group.output)]]
        calls.append(KernelCall(convention.symbol(fname), tuple(locations)))
        records.append({"name": group.name, "kind": group.kind, "func": fname,
                        "ops": group.origin, "fused": [n.op for n in group.nodes], "shape": list(group.output.shape),
                        "dtype": group.output.dtype, "flops": group.flops, "schedule": how,
                        **({"workload": list(workload[:4])} if workload else {}),
                        **({"config": cfg.to_dict()} if cfg is not None else {})})
    _report_schedules(records)
    if not primfuncs:
        raise ModelError("the network computes nothing")
    built = compiler.build(primfuncs, target=target)
    blob = _params_blob(plan)
    executor = _executor_record(func, plan, records)
    graph = graph_json(func, groups, names, plan)
    seconds = time.perf_counter() - started
    log.debug("built %d kernels (%d calls) for %s in %.2f s", len(primfuncs), len(groups),
             target.triple, seconds)
    return GraphExecutorFactoryModule(built, executor, graph, blob, calls, func, plan,
                                      build_seconds=seconds)


def _bound_checks(group):
    """The lowering context of a group: run-time bound checks added where an operator reads
    at indices taken from tensor values (OpDef.checked)."""
    if not any(OPS[node.op].checked for node in group.nodes):
        return contextlib.nullcontext()
    current = PassContext.current()
    return PassContext(current.opt_level, {**current.config, "tir.instrument_bound_checkers": True},
                       current.disabled_pass, current.out)


def _pack_weights(func: ir.Function, target, tiles):
    """Each convolution's and dense layer's constant weight put once, here, in the layout of
    the strategy its configuration chooses (:class:`~.op.weight_layout.WeightLayout`,
    recorded as the node's ``kernel_layout``); returns the function and the layers'
    configurations by node (``layer_config``'s answer, asked once per layer)."""
    configs = {}

    def visit(node, inputs):
        node = transform.with_inputs(node, inputs)
        if node.op not in LAID_OUT or not node.inputs[1].is_const:
            return node
        answer = layer_config(Group(nodes=[node], anchor=node), target)
        layout = strategy_for(tiles, node, answer[0]).weight_layout(tiles, node)
        if layout:
            data, weight = node.inputs[:2]
            node = with_layout(node, (data, ir.const(layout.transform(weight.value), weight.name),
                                      *node.inputs[2:]), layout.attr)
        configs[id(node)] = answer
        return node
    return transform.rewrite(func, visit), configs


def _report_schedules(records) -> None:
    """Inside ``apply_history_best``, the layers that kept the default schedule, in one line."""
    if current_context() is None:
        return
    untuned = [r["name"] for r in records if r["schedule"] == "default"]
    tunable = sum(1 for r in records if r["schedule"])
    if untuned:
        log.warning("%d of %d tunable layers have no tuned configuration in the log and use the "
                    "default schedule: %s", len(untuned), tunable, ", ".join(untuned[:8]) +
                    (", ..." if len(untuned) > 8 else ""))


def _outputs_computed(func: ir.Function) -> ir.Function:
    """Every graph output the result of a kernel of its own: an output that is an input, a
    constant or another output again gets a copy."""
    outputs, seen = [], set()
    for out in func.outputs:
        if out.op in ("input", "const", "param") or id(out) in seen:
            out = ir.Node("copy", (out,), {}, out.shape, out.dtype, out.name, origin=("Identity",))
        seen.add(id(out))
        outputs.append(out)
    return ir.Function(func.inputs, outputs, func.name)


def _signature(group) -> tuple:
    inside = {id(n): k for k, n in enumerate(group.nodes)}
    external = {id(n): k for k, n in enumerate(group.inputs())}
    parts = []
    for node in group.nodes:
        refs = tuple(("n", inside[id(i)]) if id(i) in inside else
                     ("in", external[id(i)], i.shape, i.dtype) for i in node.inputs)
        parts.append((node.op, repr(sorted(node.attrs.items())), node.shape, node.dtype, refs))
    return tuple(parts)


def _params_blob(plan) -> bytes:
    blob = bytearray(plan.params_bytes)
    for node in plan.params:
        offset = plan.locations[id(node)].index
        data = np.ascontiguousarray(node.value).tobytes()
        blob[offset:offset + len(data)] = data
    return bytes(blob)


def _tensor_record(node, name) -> dict:
    return {"name": name, "shape": list(node.shape), "dtype": node.dtype}


def _executor_record(func, plan, kernels) -> dict:
    return {
        "format": convention.FORMAT, "version": convention.VERSION,
        "inputs": [_tensor_record(n, n.name) for n in func.inputs],
        "outputs": [_tensor_record(n, f"output{k}") for k, n in enumerate(func.outputs)],
        "params": [dict(_tensor_record(n, f"p{k}"), offset=plan.locations[id(n)].index)
                   for k, n in enumerate(plan.params)],
        "params_bytes": plan.params_bytes,
        "workspace_bytes": plan.workspace_bytes,
        "naive_bytes": plan.naive_bytes,
        "kernels": kernels,
    }


class GraphExecutorFactoryModule(RunsHere):
    """What ``relay.build`` returns (TVM's name): the compiled network, exportable as one
    shared library (kernels, entry points, weights, graph) and runnable here."""

    def __init__(self, built: BuiltModule, executor: dict, graph: str, blob: bytes, calls,
                 func, plan, build_seconds: float = 0.0):
        self.lib = built
        self.executor = executor
        self.graph_json = graph
        self._blob = blob
        self._calls = calls
        self.ir_mod = ir.IRModule(func)
        self.plan = plan
        self.build_seconds = build_seconds
        self.target = built.target
        self.metadata = dict(built.metadata)
        self.metadata["functions"] = built.metadata["functions"] + entry_functions(executor)
        self.metadata["entry"] = convention.RUN
        self.metadata["executor"] = executor
        self.metadata["graph"] = json.loads(graph)
        self._load_lock = threading.Lock()

    # TVM's accessors
    def get_graph_json(self) -> str:
        return self.graph_json

    def get_params(self) -> dict:
        """The weights as the graph names them (``p0``...), after folding; ndarrays."""
        return {r["name"]: np.frombuffer(self._blob, dtype=r["dtype"], count=math.prod(r["shape"]),
                                         offset=r["offset"]).reshape(r["shape"])
                for r in self.executor["params"]}

    def get_lib(self) -> BuiltModule:
        return self.lib

    def get_source(self, fmt: str = "c") -> str:
        """``"c"``: the entry points' C source; other formats as ``BuiltModule.get_source``."""
        if fmt == "c":
            return entry_source(self._calls, len(self.executor["inputs"]),
                                len(self.executor["outputs"]), self.executor["params_bytes"])
        return self.lib.get_source(fmt)

    def export_library(self, path, fcompile=None):
        """Write the network as one shared library (docs/models.md)."""
        from ..deploy.toolchain import find_toolchain

        if fcompile is not None:
            raise ValueError("export_library of a network links with kernelrpc's toolchain for "
                             "the target; fcompile= is not supported")
        toolchain = find_toolchain(self.target)
        path = Path(path)
        with tempfile.TemporaryDirectory(prefix="kernelrpc-net-") as tmp:
            tmp = Path(tmp)
            digest = hashlib.sha256(self._blob).hexdigest()[:16]
            blob = tmp / f"params-{digest}.bin"
            blob.write_bytes(self._blob)
            (tmp / "params.c").write_text(params_source(blob))
            (tmp / "network.c").write_text(self.get_source("c"))
            objects = [toolchain.compile_c(tmp / "network.c", tmp / "network.o"),
                       toolchain.compile_c(tmp / "params.c", tmp / "params.o")]
            self.metadata = link_module(path, self.lib._compiled.object_code, self.metadata,
                                        self.target, inputs=LinkInputs(objects=objects))
        return path

    def __repr__(self) -> str:
        return (f"<GraphExecutorFactoryModule {len(self.executor['kernels'])} kernels for "
                f"{self.target.triple}>")
