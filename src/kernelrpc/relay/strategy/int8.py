"""The integer layers' strategy tables (:mod:`kernelrpc.relay.op.quant`): ``qnn.conv2d`` and
``qnn.dense`` accumulate in int32 in the float layers' register tiles (the direct
convolution's output channels x columns, the dense layer's orders), the requantizing output
stage on the tile in registers. The schedules are the float ones run on the int32
accumulation; each record's reference is the operator's numpy form."""
from __future__ import annotations

from ..op import quant
from .dense import DENSE
from .direct import define_direct_knobs, schedule_direct
from .record import Strategy


def accumulation(tensor):
    """The int32 reduction stage of an integer layer: ``tensor`` itself (an int32 output) or
    the stage its requantizing output stage reads."""
    if tensor.op.reduce_axis:
        return tensor
    return next(t for t in tensor.op.input_tensors if getattr(t.op, "reduce_axis", None))


def _reference(fold):
    """numpy's answer of a layer, its other inputs (zero point, bias, multiplier) the node's
    constants."""
    def reference(data, weight, node):
        rest = [node_input.value for node_input in node.inputs[2:]]
        if any(v is None for v in rest):
            raise ValueError(f"{node.op}: the reference needs constant zero point, bias and "
                             "multiplier")
        return fold([data, weight, *rest], node.attrs)
    return reference


QCONV2D = Strategy(
    "int8_direct", "qnn.conv2d", applies=lambda tiles, node: True,
    define_knobs=define_direct_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: schedule_direct(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qconv2d))
QDENSE = Strategy(
    "int8_dense", "qnn.dense", applies=lambda tiles, node: True,
    define_knobs=DENSE.define_knobs,
    schedule=lambda s, anchor, out, tiles, cfg, node: DENSE.schedule(
        s, accumulation(anchor), out, tiles, cfg, node),
    reference=_reference(quant.np_qdense))

#: the integer layers' tables, by operator
INT8 = {"qnn.conv2d": (QCONV2D,), "qnn.dense": (QDENSE,)}
