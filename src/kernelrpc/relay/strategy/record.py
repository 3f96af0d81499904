"""One implementation of an operator class, as TVM's strategy tables hold them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import ir
from ..op.weight_layout import WeightLayout


def keeps_pad_stage(op, anchor, cfg) -> bool:
    """The padded input stays a stage of its own where the configuration's ``pad`` knob says
    ``stage`` (the strategies without that knob have no padded input)."""
    return op.tag == "pad" and "pad" in cfg and cfg["pad"].val == "stage"


@dataclass(frozen=True)
class Strategy:
    """An implementation of ``op``: ``applies(tiles, node)`` says where it can run (``node``
    as the model has it, OIHW weight); ``weight_layout(tiles, node)`` is the layout
    ``relay.build`` puts the constant weight in (the operator's compute, in
    :mod:`kernelrpc.relay.op`, reads it); ``define_knobs(cfg, tiles, node, padded)`` its
    tuning knobs; ``schedule(s, anchor, out, tiles, cfg, node)`` its loop schedule, the
    group's tail fused into it; ``reference(data, weight, node)`` numpy's answer, the check of
    a tuning candidate (``weight`` in the strategy's layout). ``name`` is the value of the
    class's ``layout`` knob that picks it. ``keeps_stage(op, anchor, cfg)`` says which of the
    group's elementwise stages the schedule places itself; the others are inlined."""

    name: str
    op: str
    applies: Callable
    define_knobs: Callable
    schedule: Callable
    reference: Callable
    weight_layout: Callable = lambda tiles, node: WeightLayout()
    keeps_stage: Callable = keeps_pad_stage
    #: a tuning candidate's tolerance, of the reference's largest magnitude (0: the runner's)
    scale_atol: float = 0.0


def as_modelled(node: ir.Node) -> ir.Node:
    """The layer with the model's weight (the weight ``relay.build`` packed or transformed
    seen in the model's shape, :meth:`WeightLayout.model_shape`): what the rule and the knobs
    are decided on, so that a layer's space is the same before and after its weight is laid
    out."""
    layout = WeightLayout.of(node.attrs)
    if not layout:
        return node
    data, weight = node.inputs[:2]
    modelled = ir.Node("input", (), {}, tuple(layout.model_shape(weight.shape)), weight.dtype,
                       weight.name)
    attrs = {k: v for k, v in node.attrs.items() if k != "kernel_layout"}
    return ir.Node(node.op, (data, modelled, *node.inputs[2:]), attrs, node.shape, node.dtype,
                   node.name, origin=node.origin)
