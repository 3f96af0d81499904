"""A network's tunable layers as AutoTVM tasks, and their tuned configurations in ``relay.build``.

Each convolution and dense layer, float or integer, is a task of the template of its
operator (``conv2d_nchw``, ``dense``, ``qnn_conv2d_nchw``, ``qnn_dense``); its workload is
what the schedule depends on: the input and weight shapes, the operator's attributes, the
dtype and the target. An integer layer's workload also records its operands' shapes and types
and what its constants decided (the sums' type, the strategy whose instruction the weight
fits: :func:`_integer_facts`), so that its task computes what the network's layer does with
operands of its own (:func:`~kernelrpc.relay.op.quant.sample_operands`). Layers of the same
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
from .op import node_flops, quant
from .op.weight_layout import WeightLayout
from .schedule import group_tensors, schedule_group
from .strategy import as_modelled, layout_candidates, strategy_for, tiles_for
from .strategy.int8 import window_triples
from .transform import optimize, rewrite, with_inputs, with_layout

log = logging.getLogger("kernelrpc.relay")

#: the template of each tunable operator
TEMPLATES = {"nn.conv2d": "conv2d_nchw", "nn.dense": "dense",
             "qnn.conv2d": "qnn_conv2d_nchw", "qnn.dense": "qnn_dense"}
INTEGER_OPS = ("qnn.conv2d", "qnn.dense")
#: the operators whose constant weight ``relay.build`` lays out (:class:`WeightLayout`)
LAID_OUT = ("nn.conv2d", "nn.dense")
#: an integer layer's workload attribute: its operands' ``[shape, dtype]``
OPERANDS = "operands"


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
    anchor = as_modelled(anchor) if anchor.op in LAID_OUT else anchor
    data, weight = anchor.inputs[:2]
    attrs = dict(anchor.attrs)
    if anchor.op in INTEGER_OPS:
        attrs.update(_integer_facts(anchor, target))
    attrs = [[k, _jsonable(v)] for k, v in sorted(attrs.items())]
    shape = list(weight.shape)
    return (name, list(data.shape), shape, attrs, anchor.dtype, str(target))


def _integer_facts(anchor: ir.Node, target) -> dict:
    """What an integer layer's schedule and computation take from its constants' values (the
    strategy whose instruction its weight fits, :func:`~kernelrpc.relay.op.quant.value_facts`),
    and its operands' shapes and types."""
    tiles = tiles_for(Target(str(target)))
    return {**quant.value_facts(anchor), "strategy": strategy_for(tiles, anchor).name,
            OPERANDS: [[list(i.shape), i.dtype] for i in anchor.inputs]}


def _anchor_group(op: str, data_shape, weight_shape, attrs, dtype) -> Group:
    from .op import OPS

    attrs = dict(attrs)
    operands = attrs.pop(OPERANDS, None)
    if operands is None:
        operands = [(data_shape, dtype), (weight_shape, dtype)]
    names = ("data", "weight", *(f"operand{i}" for i in range(2, len(operands))))
    inputs = tuple(ir.Node("input", (), {}, tuple(shape), operand_dtype, name)
                   for (shape, operand_dtype), name in zip(operands, names))
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}
    shape, out_dtype = OPS[op].infer(list(inputs), attrs)
    node = ir.Node(op, inputs, attrs, tuple(shape), out_dtype, op)
    return Group(nodes=[node], anchor=node)


def _instantiate(op: str, data_shape, weight_shape, attrs, dtype, target):
    """The template's schedule and arguments: the layer's own, its weight argument in its
    strategy's layout (as in the network); where the candidate strategies read more than one
    array, the OIHW weight and its laid-out copies (:func:`_weight_copies`), each
    configuration reading the one its layout reads (a network lays the weight out at build
    time, so none is timed laying it out)."""
    group = _anchor_group(op, data_shape, weight_shape, attrs, dtype)
    cfg, tiles = autotvm.get_config(), tiles_for(Target(target))
    node = group.anchor
    layout = strategy_for(tiles, node, cfg).weight_layout(tiles, node)
    if layout:
        group = _with_weight(node, layout.shape(weight_shape), layout)
    placeholders, out, anchor = group_tensors(group)
    s = schedule_group(group, out, anchor, tiles, cfg)
    copies = _weight_copies(tiles, node)
    if copies:
        data, weight = placeholders
        arrays = [WeightLayout(), *copies]
        read = 0 if layout.is_model_array else arrays.index(layout)
        placeholders = [data, *(weight if i == read else te.placeholder(
            array.shape(weight_shape), name=f"unused_weight{i}", dtype=dtype)
            for i, array in enumerate(arrays))]
    return s, [*placeholders, out]


def _weight_copies(tiles, node) -> list[WeightLayout]:
    """The layouts of a convolution's or dense layer's task's weight arguments after the
    model's one: each layout but the model's array that a candidate strategy reads, in the
    candidates' order (none for a layer of one candidate, whose one weight argument is in its
    layout: a Winograd layer's the transformed weight)."""
    if node.op not in LAID_OUT:
        return []
    found = layout_candidates(tiles, node)
    layouts = []
    for strategy in found if len(found) > 1 else ():
        layout = strategy.weight_layout(tiles, as_modelled(node))
        if not layout.is_model_array and layout not in layouts:
            layouts.append(layout)
    return layouts


def _with_weight(node: ir.Node, shape, layout: WeightLayout) -> Group:
    """The layer with a weight argument of ``shape`` in ``layout``."""
    weight = ir.Node("input", (), {}, tuple(shape), node.dtype, "weight")
    node = with_layout(node, (node.inputs[0], weight), layout.attr)
    return Group(nodes=[node], anchor=node)


@autotvm.template("conv2d_nchw")
def conv2d_nchw(data_shape, weight_shape, attrs, dtype, target):
    """A network's convolution (NCHW data, OIHW weight) with its default schedule's knobs."""
    return _instantiate("nn.conv2d", data_shape, weight_shape, attrs, dtype, target)


@autotvm.template("dense")
def dense(data_shape, weight_shape, attrs, dtype, target):
    """A network's dense layer (``data @ weight``, weight K x N) with its schedule's knobs."""
    return _instantiate("nn.dense", data_shape, weight_shape, attrs, dtype, target)


@autotvm.template("qnn_conv2d_nchw")
def qnn_conv2d_nchw(data_shape, weight_shape, attrs, dtype, target):
    """A network's integer convolution (its operands and what its constants decided in
    ``attrs``: :func:`_integer_facts`) with its strategy's knobs."""
    return _instantiate("qnn.conv2d", data_shape, weight_shape, attrs, dtype, target)


@autotvm.template("qnn_dense")
def qnn_dense(data_shape, weight_shape, attrs, dtype, target):
    """A network's integer dense layer, as :func:`qnn_conv2d_nchw`."""
    return _instantiate("qnn.dense", data_shape, weight_shape, attrs, dtype, target)


def task_of(wkl: tuple, flop: float) -> Task:
    """The tuning task of a workload, its candidates checked against its default strategy's
    numpy reference (a Winograd layer's task, whose weight argument is the transformed
    weight, against numpy's Winograd); an integer layer's against the operator's numpy form,
    on operands its computation takes exactly (:func:`.op.quant.sample_operands`)."""
    from .op import OPS

    name, data_shape, weight_shape, attrs, dtype, target = wkl
    op = next(op for op, template in TEMPLATES.items() if template == name)
    node = _anchor_group(op, data_shape, weight_shape, attrs, dtype).anchor
    tiles = tiles_for(Target(target))
    strategy = strategy_for(tiles, node)
    if op in INTEGER_OPS:
        def reference(*operands):
            return OPS[op].fold(list(operands), node.attrs)
    else:
        def reference(data, weight, *packed):
            return strategy.reference(data, weight, node)
    task = autotvm.task.create(name, args=wkl[1:], target=target, reference=reference, flop=flop)
    task.scale_atol = strategy.scale_atol
    if op in INTEGER_OPS:
        task.prepare_inputs = lambda inputs: quant.sample_operands(node)
    copies = _weight_copies(tiles, node)
    if copies:
        def lay_out_copies(inputs: list) -> list:
            """The task's inputs with the weight's copies made from the OIHW one."""
            data, weight = inputs[:2]
            return [data, weight, *(layout.transform(weight) for layout in copies)]
        task.prepare_inputs = lay_out_copies
    return task


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
    func = int8_forms(optimize(func, params), tiles_for(target))
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


def int8_forms(func: ir.Function, tiles) -> ir.Function:
    """Each packed integer convolution (the importer's :data:`~kernelrpc.relay.op.quant.PACKED`)
    in the form its target computes it in: the ``pixels`` form
    (:data:`~kernelrpc.relay.op.quant.PACKED_PIXELS`, the same weight) where
    :func:`~kernelrpc.relay.op.quant.is_pixels_layer` holds; the window form
    (:data:`~kernelrpc.relay.op.quant.PACKED_WINDOW`) where
    :func:`~kernelrpc.relay.op.quant.is_window_layer` holds with the target's
    :func:`~kernelrpc.relay.strategy.int8.window_triples`, its weight packed again over the
    window's taps; else packed by channels. The build and the tasks of a network
    (:func:`extract_tasks`) both ask here, so that a tuned record's workload is the built
    layer's."""
    def visit(node, inputs):
        node = with_inputs(node, inputs)
        if node.op != "qnn.conv2d" or node.attrs.get("kernel_layout") != quant.PACKED:
            return node
        data, weight = node.inputs[:2]
        kernel, channels = weight.shape[2:4], data.shape[1]
        pixels = node.shape[2] * node.shape[3]
        if quant.is_pixels_layer(node.attrs, kernel, pixels):
            return with_layout(node, node.inputs, quant.PACKED_PIXELS)
        if not quant.is_window_layer(node.attrs, kernel, channels, pixels, window_triples(tiles)):
            return node
        integers = quant.unpack_weight(weight.value, node.shape[1], channels)
        packed = ir.const(quant.pack_weight(quant.window_weight(integers)), weight.name)
        return with_layout(node, (data, packed, *node.inputs[2:]), quant.PACKED_WINDOW,
                           window=tuple(kernel))
    return rewrite(func, visit)


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
