"""A network's tunable layers as AutoTVM tasks, and their tuned configurations in ``relay.build``.

Each convolution and dense layer is a task of the template of its operator
(``conv2d_nchw``, ``dense``); its workload is what the schedule depends on: the input and
weight shapes, the operator's attributes, the dtype and the target. Layers of the same
workload share a task (``extract_from_program`` returns each once). The template is the
anchor alone, scheduled by the same code as the network's layer (:mod:`.schedule`), so a
configuration measured on the task is the configuration the layer gets: inside
``autotvm.apply_history_best(log)`` ``relay.build`` schedules every layer whose workload the log
holds with its best configuration, and the others with the target's defaults.
"""
from __future__ import annotations

import json
import logging

import numpy as np

from .. import autotvm, te
from ..autotvm.task import Task, current_context
from ..compiler.target import Target
from . import ir
from .fuse import Group, partition
from .op import node_flops
from .op import winograd
from .op.nn import pack_weight, packed_lanes
from .schedule import (channel_tiles, conv_layout, group_tensors, schedule_group, tiles_for,
                       winograd_plan)
from .transform import optimize

log = logging.getLogger("kernelrpc.relay")

#: how far a Winograd candidate's outputs may be from numpy's, of their largest magnitude
#: (F(4x4)'s rounding: up to 2e-5 measured on 512 input channels)
WINOGRAD_ATOL = 1e-4

#: the template of each tunable operator
TEMPLATES = {"nn.conv2d": "conv2d_nchw", "nn.dense": "dense"}


def _jsonable(value):
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return value


def workload(anchor: ir.Node, target) -> tuple | None:
    """``(template name, *args)`` of a layer, or None when its operator is not tunable."""
    name = TEMPLATES.get(anchor.op)
    if name is None:
        return None
    data, weight = anchor.inputs[:2]
    shape, attrs = list(weight.shape), dict(anchor.attrs)
    if packed_lanes(attrs):             # packed by relay.build: the layer's OIHW workload
        shape = [shape[0] * shape[4], *shape[1:4]]
        del attrs["kernel_layout"]
    elif winograd.layout_of(attrs):     # transformed by relay.build
        shape = winograd.oihw_shape(shape)
        del attrs["kernel_layout"]
    attrs = [[k, _jsonable(v)] for k, v in sorted(attrs.items())]
    return (name, list(data.shape), shape, attrs, anchor.dtype, str(target))


def _anchor_group(op: str, data_shape, weight_shape, attrs, dtype) -> Group:
    from .op import OPS

    data = ir.Node("input", (), {}, tuple(data_shape), dtype, "data")
    weight = ir.Node("input", (), {}, tuple(weight_shape), dtype, "weight")
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs}
    shape, out_dtype = OPS[op].infer([data, weight], attrs)
    node = ir.Node(op, (data, weight), attrs, tuple(shape), out_dtype, op)
    return Group(nodes=[node], anchor=node)


def _instantiate(op: str, data_shape, weight_shape, attrs, dtype, target):
    """The template's schedule and arguments: the layer's own (a Winograd layer's weight
    argument is its transformed weight, as in the network); where the ``channels`` layout is
    offered, the OIHW weight and its packed copy (``[O/V][I][KH][KW][V]``) both, each
    configuration reading the one its layout reads (a network packs the weight at build time,
    so neither is timed packing it)."""
    group = _anchor_group(op, data_shape, weight_shape, attrs, dtype)
    cfg, tiles = autotvm.get_config(), tiles_for(Target(target))
    layout = conv_layout(group, tiles, cfg) if op == "nn.conv2d" else "OIHW"
    node = group.anchor
    transformed = winograd.parse_layout(layout)
    if transformed:
        m, lanes = transformed
        a = m + 2
        group = _with_weight(node, (a, a, weight_shape[0] // lanes, weight_shape[1], lanes),
                             layout)
    elif layout != "OIHW":
        group = _with_weight(node, _packed_shape(weight_shape, tiles.lanes), layout)
    placeholders, out, anchor = group_tensors(group)
    s = schedule_group(group, out, anchor, tiles, cfg)
    if not transformed and op == "nn.conv2d" and channel_tiles(tiles, node):
        other = te.placeholder(_packed_shape(weight_shape, tiles.lanes) if layout == "OIHW"
                               else tuple(weight_shape), name="unused_weight", dtype=dtype)
        data, weight = placeholders
        placeholders = [data, weight, other] if layout == "OIHW" else [data, other, weight]
    return s, [*placeholders, out]


def _packed_shape(weight_shape, lanes: int) -> tuple:
    out_channels, *rest = weight_shape
    return (out_channels // lanes, *rest, lanes)


def _with_weight(node: ir.Node, shape, layout: str) -> Group:
    """The layer with a weight argument of ``shape`` in ``layout``."""
    weight = ir.Node("input", (), {}, tuple(shape), node.dtype, "weight")
    node = ir.Node(node.op, (node.inputs[0], weight), {**node.attrs, "kernel_layout": layout},
                   node.shape, node.dtype, node.op)
    return Group(nodes=[node], anchor=node)


@autotvm.template("conv2d_nchw")
def conv2d_nchw(data_shape, weight_shape, attrs, dtype, target):
    """A network's convolution (NCHW data, OIHW weight) with its default schedule's knobs."""
    return _instantiate("nn.conv2d", data_shape, weight_shape, attrs, dtype, target)


@autotvm.template("dense")
def dense(data_shape, weight_shape, attrs, dtype, target):
    """A network's dense layer (``data @ weight``, weight K x N) with its schedule's knobs."""
    return _instantiate("nn.dense", data_shape, weight_shape, attrs, dtype, target)


def conv2d_reference(data, weight, *, strides, padding, dilation, groups, upsample=(1, 1)):
    """numpy's convolution (NCHW, OIHW, grouped, strided, dilated, padded), the check of a
    tuning candidate."""
    if tuple(upsample) != (1, 1):
        n, c, h, w = data.shape
        spread = np.zeros((n, c, (h - 1) * upsample[0] + 1, (w - 1) * upsample[1] + 1), data.dtype)
        spread[:, :, ::upsample[0], ::upsample[1]] = data
        data = spread
    pt, pl, pb, pr = padding
    data = np.pad(data, ((0, 0), (0, 0), (max(pt, 0), max(pb, 0)), (max(pl, 0), max(pr, 0))))
    h, w = data.shape[2:]
    data = data[:, :, max(-pt, 0):h - max(-pb, 0), max(-pl, 0):w - max(-pr, 0)]
    oc, cg, kh, kw = weight.shape
    (sh, sw), (dh, dw) = strides, dilation
    windows = np.lib.stride_tricks.sliding_window_view(
        data, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    n, c, oh, ow = windows.shape[:4]
    windows = windows.reshape(n, groups, cg, oh, ow, kh, kw)
    w = weight.reshape(groups, oc // groups, cg, kh, kw)
    out = np.einsum("ngchwyx,gocyx->ngohw", windows.astype(np.float64), w.astype(np.float64))
    return out.reshape(n, oc, oh, ow).astype(data.dtype)


def task_of(wkl: tuple, flop: float) -> Task:
    """The tuning task of a workload, its candidates checked against numpy (a Winograd layer's
    task, whose weight argument is the transformed weight, against numpy's Winograd)."""
    name, data_shape, weight_shape, attrs, dtype, target = wkl
    if name == "conv2d_nchw":
        kwargs = dict(attrs)
        node = _anchor_group("nn.conv2d", data_shape, weight_shape, attrs, dtype).anchor
        plan = winograd_plan(tiles_for(Target(target)), node)

        def reference(data, weight, *packed):
            if plan:
                return winograd.reference(data, weight, m=plan[0], padding=kwargs["padding"],
                                          out_shape=node.shape)
            return conv2d_reference(data, weight, **kwargs)
    else:
        plan = None

        def reference(data, weight):
            return (data.astype(np.float64) @ weight.astype(np.float64)).astype(data.dtype)
    task = autotvm.task.create(name, args=wkl[1:], target=target, reference=reference, flop=flop)
    if name == "conv2d_nchw" and plan:
        task.scale_atol = WINOGRAD_ATOL
    elif task.n_inputs == 3:              # the OIHW weight and its packed copy
        task.prepare_inputs = _pack_second
    return task


def _pack_second(inputs: list) -> list:
    """The task's inputs with the packed weight made from the OIHW one."""
    data, weight, packed = inputs
    return [data, weight, pack_weight(weight, packed.shape[-1])]


def extract_from_program(mod, target, params=None, ops=None) -> list[Task] | None:
    """``autotvm.task.extract_from_program`` for a network: one task per distinct workload,
    in the order the network runs them, each task's ``layers`` the count of layers it stands
    for; ``ops`` (``["nn.conv2d"]``) keeps those operators' tasks. None for what is not a
    network."""
    func = mod["main"] if isinstance(mod, ir.IRModule) else mod
    if not isinstance(func, ir.Function):
        return None
    tasks = extract_tasks(func, target, params)
    if ops is None:
        return tasks
    names = set()
    for op in ops:
        op = getattr(op, "name", op)
        if op not in TEMPLATES:
            raise ValueError(f"extract_from_program: {op!r} is not tunable; tunable operators: "
                             f"{', '.join(sorted(TEMPLATES))}")
        names.add(TEMPLATES[op])
    return [t for t in tasks if t.name in names]


autotvm.task.PROGRAM_EXTRACTORS.append(extract_from_program)


def extract_tasks(func: ir.Function, target, params=None) -> list[Task]:
    """The tunable layers of a network, one task per workload (see extract_from_program)."""
    target = Target(target)
    func = optimize(func, params)
    found: dict[tuple, list] = {}
    for group in partition(func):
        if group.anchor is None:
            continue
        wkl = workload(group.anchor, target)
        if wkl is None:
            continue
        key = json.dumps(wkl)
        if key in found:
            found[key][1] += 1
        else:
            found[key] = [wkl, 1, node_flops(group.anchor)]
    tasks = []
    for wkl, layers, flop in found.values():
        task = task_of(wkl, flop)
        task.layers = layers
        tasks.append(task)
    return tasks


def layer_config(group: Group, target):
    """``(configuration, how, workload)`` of a layer: its tuned configuration and ``"tuned"``
    when the dispatch context (``apply_history_best``) has one; None and ``"default"`` when
    it has none (or outside a context); None, ``""`` and None for a layer that is not
    tunable. A logged configuration that no longer fits the template is logged and the
    default used."""
    wkl = None if group.anchor is None else workload(group.anchor, target)
    if wkl is None:
        return None, "", None
    context = current_context()
    if context is None:
        return None, "default", wkl
    try:
        config = context.query(autotvm.task.TEMPLATES[wkl[0]], wkl[1:], quiet=True)
    except ValueError as exc:
        log.warning("the tuned configuration of %s does not fit its template (%s); it uses the "
                    "default schedule", group.name, exc)
        return None, "default", wkl
    return config, ("tuned" if config is not None else "default"), wkl
