"""ONNX control flow turned into dataflow.

If: a condition that folds at import (a branch on an input's shape, or on an input fixed with
``const_inputs=``) keeps the nodes of the branch it takes. A condition read at run time has
both branches built and each output chosen with ``where``: both are computed on every run (the
cost of both), and a run-time error in the branch not taken (an index out of range) still
stops the run. The branches must then give outputs of the same shapes.

Loop and Scan: unrolled at import, when the number of iterations is known there (Loop: a
constant trip count, and a condition that folds at every iteration; Scan: the length of its
scan inputs), into at most MAX_ITERATIONS copies of the body, each reading the values the
previous one carried; the scan outputs are stacked.
"""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from .onnx_common import Unsupported, converter, normalize_axis, reshape
from .onnx_model import MAX_SUBGRAPH_NODES

#: iterations of a Loop or Scan unrolled at most
MAX_ITERATIONS = 256


# ------------------------------------------------------------------ If

@converter("If")
def _if(ctx, args, attrs):
    cond = args[0]
    if cond.size != 1:
        raise ModelError(f"If's condition has {cond.size} elements, one expected")
    branches = (attrs.get("then_branch"), "the then branch"), \
        (attrs.get("else_branch"), "the else branch")
    if cond.is_const:
        graph, what = branches[0] if bool(cond.value.reshape(())) else branches[1]
        return _outputs_of(ctx, graph, what)
    results, refusals = [], []
    for graph, what in branches:
        try:
            results.append(_outputs_of(ctx, graph, what))
        except Unsupported as exc:
            refusals.append(str(exc))
    if refusals:
        raise Unsupported("; ".join(refusals))
    cond = reshape(ctx, cond, ())
    return [_select(ctx, cond, k, a, b) for k, (a, b) in enumerate(zip(*results))]


def _outputs_of(ctx, graph, what):
    outputs = ctx.convert_graph(graph, what)
    if len(outputs) != ctx.outputs_wanted:
        raise ModelError(f"{what} has {len(outputs)} outputs, the If node {ctx.outputs_wanted}")
    return outputs


def _select(ctx, cond, k, then, other):
    """Output ``k`` of an If decided at run time: ``then`` where ``cond`` holds, else ``other``."""
    if then is other:
        return then
    if then.shape != other.shape or then.dtype != other.dtype:
        raise Unsupported(
            f"output {k} is {list(then.shape)} {then.dtype} in the then branch and "
            f"{list(other.shape)} {other.dtype} in the else branch: an If decided at run time "
            f"needs outputs of one shape and dtype; a condition known at import picks its "
            f"branch{_fix_hint(_inputs_read(cond))}")
    return ctx.make("where", [cond, then, other])


def _fix_hint(inputs: list[str]) -> str:
    if len(inputs) == 1:
        return (f" (fix the input it depends on with from_onnx(..., const_inputs="
                f"{{{inputs[0]!r}: VALUE}}) or --const {inputs[0]}=VALUE)")
    if inputs:
        return (f" (fix the inputs it depends on, {', '.join(map(repr, inputs))}, with "
                "from_onnx(..., const_inputs=...) or --const NAME=VALUE)")
    return ""


def _inputs_read(node) -> list[str]:
    """The names of the network inputs ``node`` is computed from."""
    stack, seen, names = [node], set(), []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op == "input":
            names.append(node.name)
        stack.extend(node.inputs)
    return sorted(names)


# ------------------------------------------------------------------ Loop and Scan

def _body_size(graph) -> int:
    """The nodes of ``graph``, those of its subgraphs included."""
    size = 0
    for node in graph.node:
        size += 1
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                size += _body_size(sub)
    return size


def _check_unrolled(body, iterations: int, what: str) -> None:
    if iterations > MAX_ITERATIONS:
        raise Unsupported(f"{what} runs {iterations} iterations; at most {MAX_ITERATIONS} are "
                          "unrolled")
    size = _body_size(body)
    if iterations * size > MAX_SUBGRAPH_NODES:
        raise Unsupported(f"{what}'s body of {size} nodes unrolled {iterations} times is more "
                          f"than {MAX_SUBGRAPH_NODES} nodes")


def _body_inputs(body, count: int, what: str) -> list[str]:
    if len(body.input) != count:
        raise ModelError(f"{what}'s body has {len(body.input)} inputs, {count} expected")
    return [info.name for info in body.input]


def _scalar(value: np.ndarray, what: str):
    if value.size != 1:
        raise ModelError(f"{what} has {value.size} elements, one expected")
    return value.reshape(()).item()


def _stack(ctx, items, axis: int):
    """``items`` (of one shape and dtype) stacked along a new axis ``axis``."""
    first = items[0]
    for item in items[1:]:
        if item.shape != first.shape or item.dtype != first.dtype:
            raise ModelError(f"scan output of {list(first.shape)} {first.dtype} in one "
                             f"iteration and {list(item.shape)} {item.dtype} in another")
    shape = (*first.shape[:axis], 1, *first.shape[axis:])
    parts = [reshape(ctx, item, shape) for item in items]
    return parts[0] if len(parts) == 1 else ctx.make("concatenate", parts, axis=axis)


@converter("Loop")
def _loop(ctx, args, attrs):
    """Iteration ``i`` binds the body's iteration number to ``i`` and its condition to true;
    the loop stops after ``M`` iterations or when the body's condition output (which must fold)
    is false; a loop with neither is refused as endless."""
    body = attrs.get("body")
    trip_arg = args[0] if args else None
    cond_arg = args[1] if len(args) > 1 else None
    carried = list(args[2:])
    if trip_arg is None and cond_arg is None:
        raise Unsupported("a Loop with neither a trip count nor a condition never ends")
    trips = None if trip_arg is None else int(_scalar(ctx.constant(
        trip_arg, "Loop's trip count M", "a trip count known at import only: fix the input it "
        "depends on with from_onnx(..., const_inputs=...) or --const NAME=VALUE"),
        "Loop's trip count M"))
    going = True if cond_arg is None else bool(_scalar(ctx.constant(
        cond_arg, "Loop's initial condition"), "Loop's initial condition"))
    names = _body_inputs(body, 2 + len(carried), "the Loop")
    scans = len(body.output) - 1 - len(carried)
    if scans < 0:
        raise ModelError(f"the Loop's body has {len(body.output)} outputs, fewer than its "
                         f"{len(carried)} carried values and the condition")
    if trips is not None:
        _check_unrolled(body, max(trips, 0), "the Loop")
    scanned, i = [], 0
    while going and (trips is None or i < trips):
        if i == MAX_ITERATIONS:
            raise Unsupported(f"the Loop's condition still holds after {MAX_ITERATIONS} "
                              "iterations, the most that are unrolled")
        what = f"the Loop's body (iteration {i})"
        bindings = dict(zip(names, [ir.const(np.asarray(i, np.int64)),
                                    ir.const(np.asarray(True)), *carried]))
        outputs = ctx.convert_graph(body, what, bindings)
        cond = outputs[0]
        if not cond.is_const:
            raise Unsupported(f"{what} computes its condition from data at run time; only a "
                              "Loop whose iterations are known at import is unrolled")
        going = bool(_scalar(cond.value, "the Loop's condition"))
        carried = outputs[1:1 + len(carried)]
        scanned.append(outputs[1 + len(carried):])
        i += 1
    if scans and not scanned:
        raise Unsupported("a Loop of no iterations with scan outputs (empty tensors) is "
                          "not implemented")
    return carried + [_stack(ctx, [s[k] for s in scanned], 0) for k in range(scans)]


def _scan_axes(attrs, name, count, rank_of, default=0):
    axes = attrs.ints(name, [default] * count)
    if len(axes) != count:
        raise ModelError(f"Scan's {name} has {len(axes)} entries, {count} expected")
    return [normalize_axis(a, rank_of(k), f"Scan's {name}") for k, a in enumerate(axes)]


@converter("Scan", since=9)
def _scan(ctx, args, attrs):
    """Iteration ``t`` binds each scan input's element ``t`` along its axis (from the end when
    its direction is 1); each scan output's elements are stacked along its axis, in reverse
    order when its direction is 1."""
    body = attrs.get("body")
    count = int(attrs.get("num_scan_inputs"))
    if not 1 <= count <= len(args):
        raise ModelError(f"Scan's num_scan_inputs {count} with {len(args)} inputs")
    states, sequences = list(args[:len(args) - count]), args[len(args) - count:]
    names = _body_inputs(body, len(args), "the Scan")
    scans = len(body.output) - len(states)
    if scans < 0:
        raise ModelError(f"the Scan's body has {len(body.output)} outputs, fewer than its "
                         f"{len(states)} states")
    in_axes = _scan_axes(attrs, "scan_input_axes", count, lambda k: len(sequences[k].shape))
    in_dirs = attrs.ints("scan_input_directions", [0] * count)
    out_dirs = attrs.ints("scan_output_directions", [0] * scans)
    if len(in_dirs) != count or len(out_dirs) != scans:
        raise ModelError("Scan's directions need one entry per scan input and output")
    lengths = {x.shape[a] for x, a in zip(sequences, in_axes)}
    if len(lengths) != 1:
        raise ModelError(f"Scan's inputs have lengths {sorted(lengths)} along their axes")
    length = lengths.pop()
    _check_unrolled(body, length, "the Scan")
    if scans and not length:
        raise Unsupported("a Scan over empty inputs with scan outputs is not implemented")
    scanned = []
    for t in range(length):
        elements = []
        for x, axis, backward in zip(sequences, in_axes, in_dirs):
            pos = length - 1 - t if backward else t
            item = ctx.make("strided_slice", [x], slices=((axis, pos, pos + 1, 1),))
            elements.append(reshape(ctx, item, x.shape[:axis] + x.shape[axis + 1:]))
        outputs = ctx.convert_graph(body, f"the Scan's body (iteration {t})",
                                    dict(zip(names, states + elements)))
        states = outputs[:len(states)]
        scanned.append(outputs[len(states):])
    ranks = [len(scanned[0][k].shape) + 1 if scanned else 1 for k in range(scans)]
    out_axes = _scan_axes(attrs, "scan_output_axes", scans, lambda k: ranks[k])
    stacked = []
    for k, (axis, backward) in enumerate(zip(out_axes, out_dirs)):
        items = [s[k] for s in scanned]
        stacked.append(_stack(ctx, items[::-1] if backward else items, axis))
    return states + stacked
