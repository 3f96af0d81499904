"""A fused group's tensor expression and its schedule.

The group's elementwise and injective stages are inlined into its output stage. An anchor
with a strategy (:mod:`.strategy`: convolutions, dense layers, batched MatMul, a long row's
softmax, the int8 layers) is scheduled by it: a reduction computed inside the output's
register tile, the group's tail on values still in registers. Pooling and other reductions
are computed at the root, their outer loop parallel, and a group without an injective
operator runs its last axis in vectors.
"""
from __future__ import annotations

from .. import te
from ..autotvm.space import ConfigSpace
from ..compiler.tensor import ComputeOp
from .fuse import Group
from .op import OPS
from .strategy import Tiles, define_knobs, has_strategy, strategy_for
from .strategy.common import parallel_outer


def group_tensors(group: Group):
    """``(placeholders, output, anchor)``: the group as a tensor expression over its inputs."""
    inputs = group.inputs()
    placeholders, tensors = [], {}
    for k, node in enumerate(inputs):
        p = te.placeholder(node.shape, name=f"in{k}", dtype=node.dtype)
        placeholders.append(p)
        tensors[id(node)] = p
    for node in group.nodes:
        out = OPS[node.op].compute([tensors[id(i)] for i in node.inputs], node.attrs, node)
        tensors[id(node)] = out
    return placeholders, tensors[id(group.output)], tensors.get(id(group.anchor))


def schedule_group(group: Group, out, anchor, tiles: Tiles, cfg=None):
    """The group's schedule; ``cfg`` the configuration of its anchor (default: the target's
    default choices)."""
    cfg = ConfigSpace() if cfg is None else cfg
    s = te.create_schedule(out.op)
    node = group.anchor
    if not has_strategy(tiles, node):
        _schedule_root_stages(s, out, tiles.lanes if _vectorizable(group) else 1)
        return s
    if anchor.op.tag == "conv2d_unblock":
        anchor = anchor.op.input_tensors[0]
    padded = any(isinstance(st.op, ComputeOp) and st.op.tag == "pad" for st in s.stages)
    define_knobs(cfg, tiles, node, padded)
    strategy = strategy_for(tiles, node, cfg)
    for stage in list(s.stages):
        op = stage.op
        if isinstance(op, ComputeOp) and op is not out.op and not op.reduce_axis and \
                not strategy.keeps_stage(op, anchor, cfg):
            stage.compute_inline()
    strategy.schedule(s, anchor, out, tiles, cfg, node)
    return s


#: the injective operators whose groups run their output's last axis in vectors: index
#: remaps, whose lanes read consecutive elements where the remap keeps the innermost axis (a
#: copy that would gather stays a loop: ``compiler/lower/vectorize.py``)
VECTOR_REMAPS = ("reshape", "transpose", "strided_slice", "broadcast_to", "tile")


def _vectorizable(group: Group) -> bool:
    """A group whose output's last axis runs in vectors: none of its operators is injective
    but :data:`VECTOR_REMAPS` (a concatenation's vector would evaluate every input's branch
    of its selects: DenseNet's concatenations of up to 32 inputs ran 10x slower in AVX2
    vectors; a gather's lanes read scattered elements)."""
    return all(OPS[n.op].pattern != "injective" or n.op in VECTOR_REMAPS for n in group.nodes)


def _schedule_root_stages(s, out, lanes: int):
    """Every stage left at the root parallel over its outer loop, its last axis in vectors of
    ``lanes`` where it has no reduction of its own; the rest inlined."""
    for stage in list(s.stages):
        op = stage.op
        if isinstance(op, ComputeOp) and op is not out.op and not op.reduce_axis:
            stage.compute_inline()
    for stage in s.stages:
        if isinstance(stage.op, ComputeOp) and stage.attach_type == "root" and \
                stage.op is not out.op:
            parallel_outer(s, stage, lanes)
    parallel_outer(s, s[out], lanes)
