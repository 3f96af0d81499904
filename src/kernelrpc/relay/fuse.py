"""Operator fusion: the graph cut into groups, each compiled as one kernel.

A group is an anchor (convolution, dense, pooling, reduction, softmax) or an injective
operator, followed by the elementwise operators that consume only it (bias, activation,
residual add, batch normalization's affine when it could not be folded; not those of
:data:`KEPT_APART`): the tail runs in the anchor's loops and its intermediate values never
reach memory. So does a diamond of elementwise operators that read a value several times and
meet again in one node (GELU's ``x * 0.5 * (1 + erf(x / sqrt 2))``, SiLU's
``x * sigmoid(x)``, HardSwish's ``x * clip(x + 3, 0, 6) / 6``, ``x * x``: :func:`_diamond`)
after a dense layer, a batched MatMul or an elementwise group, whose output stages run in
whole vectors of the last axis.
Chains of injective operators (reshape, transpose, pad...) fuse among themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import ir
from .op import OPS, node_flops

#: most operators one kernel takes, so that one pathological chain stays compilable
MAX_GROUP = 16
#: the anchors a diamond joins (and groups without one). A convolution's output stages write
#: Winograd's m-column tiles and the ``channels`` layout's rows in vectors of the tile's
#: width: SiLU after a 64 -> 64 3x3 layer on 56x56, fused, took 1797 us against 1427 + 172
#: as two kernels (AVX2 code, one Zen 2 thread); GELU fused into its dense layer made ViT,
#: BERT and GPT-2 2-3% faster
DIAMOND_ANCHORS = ("nn.dense", "nn.batch_matmul")
#: elementwise operators that stay out of a group, by its anchor. An integer convolution
#: writes its tile back in vectors of the tile's columns (4 on AVX2), converting each value
#: to float and back; a quantized residual add of its own runs in whole vectors of the map.
#: AVX2 code, one | two Zen 2 threads, the add apart (A/B in one process, outputs equal):
#: int8 ResNet-18 38.65 -> 38.30 ms | 20.10 -> 19.96, int8 MobileNet-v2 7.16 -> 7.01 | 4.20
#: -> 4.11 (onnxruntime runs its QLinearAdd apart too)
KEPT_APART = {"qnn.conv2d": ("qnn.binary",)}


@dataclass(eq=False)
class Group:
    nodes: list = field(default_factory=list)     # in order; the last is the output
    anchor: ir.Node | None = None

    @property
    def output(self) -> ir.Node:
        return self.nodes[-1]

    def inputs(self) -> list:
        """The nodes the group reads that it does not compute, in first-use order."""
        inside = {id(n) for n in self.nodes}
        seen, out = set(), []
        for node in self.nodes:
            for i in node.inputs:
                if id(i) not in inside and id(i) not in seen:
                    seen.add(id(i))
                    out.append(i)
        return out

    @property
    def kind(self) -> str:
        """What the group computes, TVM's way: ``fused_nn_conv2d_add_relu``."""
        return "fused_" + "_".join(n.op.replace(".", "_") for n in self.nodes)

    @property
    def name(self) -> str:
        """The layer's name: the model's node its anchor (else its output) came from, so a
        profile tells one convolution from the next; its kind where the node has no name."""
        node = self.anchor if self.anchor is not None else self.output
        return node.name or self.kind

    @property
    def origin(self) -> list:
        ops = []
        for n in self.nodes:
            ops.extend(o for o in n.origin if o not in ops)
        return ops

    @property
    def flops(self) -> int:
        return sum(node_flops(n) for n in self.nodes)


def _kept_apart(group: Group, node: ir.Node) -> bool:
    """Whether ``node`` stays out of ``group`` (:data:`KEPT_APART`)."""
    return group.anchor is not None and node.op in KEPT_APART.get(group.anchor.op, ())


def _elementwise_like(node: ir.Node, source: ir.Node) -> bool:
    """An elementwise operator that can run in the loops of ``source``'s group: its shape and
    dtype."""
    return OPS[node.op].pattern in ("elemwise", "broadcast") and node.shape == source.shape \
        and node.dtype == source.dtype


def _diamond(source: ir.Node, consumers: dict, outputs: set, order: dict, placed,
             room: int) -> list | None:
    """The elementwise nodes from ``source`` (read by several, or twice by one) to the one
    node where they all meet, in order, that one last: every consumer of ``source`` and of
    each node but the last is among them, none of those is a graph output or ``placed(node)``
    (in a group already), at most ``room`` of them; else None."""
    region: dict = {}

    def admit(nodes) -> bool:
        for n in nodes:
            if id(n) not in region:
                if not _elementwise_like(n, source) or len(region) >= room or placed(n):
                    return False
                region[id(n)] = n
        return True
    if not admit(consumers[id(source)]):
        return None
    while True:
        exits = [n for n in region.values() if id(n) in outputs or
                 any(id(c) not in region for c in consumers.get(id(n), ()))]
        if len(exits) == 1:
            return sorted(region.values(), key=lambda n: order[id(n)])
        first = min(exits, key=lambda n: order[id(n)], default=None)
        if first is None or id(first) in outputs or not admit(consumers[id(first)]):
            return None


def partition(func: ir.Function) -> list[Group]:
    """The groups in an order that runs every producer before its consumers."""
    topo = func.topo()
    uses: dict = {}
    consumers: dict = {}
    for node in topo:
        for i in node.inputs:
            uses[id(i)] = uses.get(id(i), 0) + 1
            readers = consumers.setdefault(id(i), [])
            if not readers or readers[-1] is not node:      # x * x reads x twice
                readers.append(node)
    outputs = {id(o) for o in func.outputs}
    group_of: dict = {}
    groups: list[Group] = []
    order = {id(n): k for k, n in enumerate(topo)}
    planned: dict = {}          # the nodes of a diamond, by id, to the group they join

    def placed(node) -> bool:
        return id(node) in group_of or id(node) in planned
    for node in topo:
        if node.op in ("input", "param", "const"):
            continue
        pattern = OPS[node.op].pattern
        joined = planned.pop(id(node), None)
        for i in () if joined is not None else node.inputs:
            g = group_of.get(id(i))
            if g is None or g.output is not i or id(i) in outputs or len(g.nodes) >= MAX_GROUP:
                continue
            if uses.get(id(i), 0) != 1:
                if g.anchor is not None and g.anchor.op not in DIAMOND_ANCHORS:
                    continue
                region = _diamond(i, consumers, outputs, order, placed, MAX_GROUP - len(g.nodes))
                if region is not None:
                    planned.update((id(n), g) for n in region if n is not node)
                    joined = g
            elif _elementwise_like(node, i) and not _kept_apart(g, node):
                joined = g
            elif pattern == "injective" and g.anchor is None:
                joined = g
            if joined is not None:
                break
        if joined is None:
            joined = Group(anchor=node if pattern in ("anchor", "opaque") else None)
            groups.append(joined)
        joined.nodes.append(node)
        group_of[id(node)] = joined
    # a node read outside its group is its group's output (nothing joins after a node with
    # other readers), so ordered by their outputs every group runs after those it reads
    return sorted(groups, key=lambda g: order[id(g.output)])
