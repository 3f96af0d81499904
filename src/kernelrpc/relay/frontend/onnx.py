"""ONNX models to the network graph (TVM's ``relay.frontend.from_onnx``).

Every node is converted by the function registered for its operator type and the model's
opset; each converter reads the attributes it implements through :class:`Attrs`, which refuses
any other attribute that is set, so nothing is silently ignored. Nodes whose inputs are all
constant are evaluated on the spot (shape arithmetic: Shape, Gather, Concat...).
"""
from __future__ import annotations

from collections import ChainMap
from functools import partial

from .. import ir
from ..errors import ModelError, UnsupportedOperatorError
from . import (onnx_activation, onnx_control, onnx_elementwise, onnx_index,  # noqa: F401
               onnx_model, onnx_nn, onnx_norm, onnx_reduce, onnx_tensor)  # (they register)
from . import onnx_quant, onnx_recurrent  # noqa: F401  (they register)
from .onnx_common import (Attrs, Context, UnknownValue, Unsupported, find_converter,
                          supported_operators)
from .onnx_inferred import InferredTypes

__all__ = ["from_onnx", "supported_operators"]


def from_onnx(model, shape: dict | None = None, dtype="float32", opset: int | None = None,
              freeze_params: bool = True, const_inputs: dict | None = None):
    """Import an ONNX model: returns ``(mod, params)`` as TVM's ``relay.frontend.from_onnx``.

    Args:
        model: an ``onnx.ModelProto``, a path to a ``.onnx`` file, or its bytes.
        shape: input name -> static shape, required for inputs with dynamic dimensions.
        dtype: input dtype (a string, or a dict by input name) where the model has none.
        opset: override the model's opset (as TVM's).
        freeze_params: accepted for TVM's signature; weights are always constants to the graph.
        const_inputs: input name -> its value, fixed at import: the input is no longer an
            input of the network, and what depends on it only (an If on a sample rate, shape
            arithmetic) is evaluated at import.

    Raises:
        UnsupportedOperatorError: every operator (and operator use) that cannot be compiled.
        MissingShapeError: an input has a dynamic dimension and ``shape`` does not give it.
        ModelError: a malformed or inconsistent model.
    """
    model, opset = _load(model, opset)
    ctx = Context(opset)
    initializers = _bind_initializers(ctx, model.graph)
    values = onnx_model.const_input_values(model.graph, const_inputs or {}, shape or {}, dtype)
    ctx.values.update((name, ir.const(value, name)) for name, value in values.items())
    inputs = _bind_inputs(ctx, model.graph, dict(shape or {}), dtype)
    types = InferredTypes(model, inputs)
    ctx.convert_graph = partial(_convert_subgraph, ctx, types, _Budget())
    ctx.inferred_type = types.static
    _convert_nodes(ctx, model.graph, types)
    return _with_params(inputs, _outputs(ctx, model.graph), initializers)


def _load(model, opset):
    """The model proto and the opset it is read in, within the importer's limits."""
    model = onnx_model.with_functions_inlined(onnx_model.load(model))
    opset = int(opset) if opset is not None else onnx_model.default_opset(model)
    onnx_model.check_opset(opset)
    if len(model.graph.node) > onnx_model.MAX_NODES:
        raise ModelError(f"the model has {len(model.graph.node)} nodes; at most "
                         f"{onnx_model.MAX_NODES}")
    return model, opset


def _bind_initializers(ctx, graph) -> dict:
    initializers = {}
    for init in graph.initializer:
        value = onnx_model.tensor_value(init, f"initializer {init.name!r}")
        initializers[init.name] = ctx.values[init.name] = ir.const(value, init.name)
    return initializers


def _bind_inputs(ctx, graph, shape: dict, dtype) -> list:
    """The graph's ``input`` nodes, each of its static shape (the model's or ``shape=``'s);
    the inputs an initializer or ``const_inputs`` gives are not."""
    inputs = []
    for info in graph.input:
        if info.name in ctx.values:
            continue
        in_shape = onnx_model.input_shape(info, shape.pop(info.name, None))
        computed = onnx_model.input_dtype(info, dtype)
        node = ir.Node("input", (), {}, in_shape, onnx_model.boundary_dtype(info, computed),
                       info.name)
        ctx.values[info.name] = _cast_at_boundary(ctx, node, computed, info.name)
        inputs.append(node)
    if shape:
        raise ModelError(f"shape= names {', '.join(map(repr, shape))}, which "
                         f"{'is not an input' if len(shape) == 1 else 'are not inputs'} of the "
                         f"model (inputs: {', '.join(repr(i.name) for i in inputs) or 'none'})")
    return inputs


def _convert_nodes(ctx, graph, types) -> None:
    """Every node converted in order. A node that cannot be is recorded and its outputs are
    stood in for by nodes of the shapes ONNX's shape inference gives (``types``), so that the
    nodes downstream are checked too; all refusals are reported together."""
    wanted = _consumers(graph) | {out.name for out in graph.output}
    failures = []
    for index, node in enumerate(graph.node):
        ctx.node_name = node.name or f"{node.op_type}_{index}"
        ctx.op_type = node.op_type
        ctx.outputs_wanted = len(node.output)
        ctx.output_names = tuple(node.output)
        unknown = any(name and name not in ctx.values and name in types.unknown
                      for name in _reads(node))
        outputs = []
        try:
            if unknown:         # downstream of a refusal, shapes unknown: its operator checked
                _converter_of(ctx, node)
            else:
                outputs = _convert_node(ctx, node)
        except UnknownValue:
            pass                                   # it needed a refused node's value
        except Unsupported as exc:
            failures.append((_op_name(node), ctx.node_name, ctx.opset, str(exc)))
        if unknown:
            types.unknown.update(node.output)
            continue
        for k, name in enumerate(node.output):
            if not name:
                continue
            if k < len(outputs):
                ctx.values[name] = outputs[k]
                continue
            if name not in wanted:
                continue
            if outputs:
                failures.append((node.op_type, ctx.node_name, ctx.opset,
                                 f"output {k} ({name!r}) is not implemented"))
            stand_in = types.stand_in(name)
            if stand_in is not None:
                ctx.values[name] = stand_in
    if failures:
        raise UnsupportedOperatorError(failures)


class _Budget:
    """The subgraph nodes converted so far in one import (If branches, unrolled Loop and Scan
    bodies: a body is converted once per iteration), bounded by MAX_SUBGRAPH_NODES."""

    def __init__(self):
        self.nodes = 0

    def spend(self, count: int) -> None:
        self.nodes += count
        if self.nodes > onnx_model.MAX_SUBGRAPH_NODES:
            raise Unsupported(f"the subgraphs (If branches, Loop and Scan bodies once per "
                              f"iteration) come to more than {onnx_model.MAX_SUBGRAPH_NODES} "
                              "nodes to convert")


def _convert_subgraph(ctx, types, budget, graph, what: str, bindings: dict | None = None) -> list:
    """The output values of ``graph`` (an If's branch, a Loop's body in one iteration), its
    nodes converted into ``ctx`` in a scope of their own: they read the enclosing graphs'
    values, ``bindings`` (the subgraph's inputs, name -> value) and its own initializers; what
    they define is not seen outside. A refusal inside is an Unsupported naming ``what`` and every refused node."""
    budget.spend(len(graph.node))
    saved = ctx.values, ctx.node_name, ctx.op_type, ctx.outputs_wanted, ctx.output_names
    ctx.values = ChainMap(dict(bindings or {}), ctx.values)
    try:
        _bind_initializers(ctx, graph)
        _convert_nodes(ctx, graph, types)
        return [_value(ctx, out.name, what) for out in graph.output]
    except UnsupportedOperatorError as exc:
        raise Unsupported(f"in {what}, " + "; ".join(
            f"{op} (node {name!r}){': ' + why if why else ''}"
            for op, name, _, why in exc.unsupported)) from None
    finally:
        ctx.values, ctx.node_name, ctx.op_type, ctx.outputs_wanted, ctx.output_names = saved


#: ONNX's own operator domains (another's operators, onnxruntime's ``com.microsoft``, are
#: registered under ``domain.Op``: their converters check the node's form, ONNX has no schema)
_ONNX_DOMAINS = ("", "ai.onnx")


def _converter_of(ctx, node):
    """The converter of the node's operator in the model's opset; Unsupported when none."""
    found = find_converter(_op_name(node), ctx.opset)
    if found is None:
        raise Unsupported("no converter" if node.domain in _ONNX_DOMAINS else
                          "operators of this custom domain are not supported")
    since, convert = found
    if node.domain in _ONNX_DOMAINS and \
            not onnx_model.operator_version_known(node.op_type, ctx.opset, since):
        raise Unsupported(f"this version of the operator (newer than opset "
                          f"{onnx_model.MAX_OPSET}'s) is not implemented")
    return convert


def _convert_node(ctx, node) -> list:
    """The node's output values; Unsupported when kernelrpc cannot compile it."""
    convert = _converter_of(ctx, node)
    args = [_value(ctx, name, f"node {ctx.node_name!r} ({node.op_type})") if name else None
            for name in node.input]
    if node.domain in _ONNX_DOMAINS:
        onnx_model.check_node_form(node, ctx.opset, f"node {ctx.node_name!r} ({node.op_type})")
    attrs = Attrs(node)
    try:
        outputs = convert(ctx, args, attrs)
        attrs.done()
    except Unsupported:
        raise
    except ModelError as exc:
        raise ModelError(f"node {ctx.node_name!r} ({node.op_type}): {exc}") from None
    return outputs


def _value(ctx, name, reader: str):
    if name not in ctx.values:
        raise ModelError(f"{reader} reads {name!r}, which no earlier node, input or "
                         "initializer defines (the graph is not in topological order or is "
                         "incomplete)")
    return ctx.values[name]


def _op_name(node) -> str:
    return node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}.{node.op_type}"


def _cast_at_boundary(ctx, node, dtype: str, name: str):
    """``node`` cast to ``dtype``: a float16 input to the float32 the network computes in, a
    computed output back to float16."""
    if node.dtype == dtype:
        return node
    ctx.node_name, ctx.op_type = name, "Cast"
    return ctx.make("cast", [node], dtype=dtype)


def _outputs(ctx, graph) -> list:
    outputs = []
    for out in graph.output:
        if out.name not in ctx.values:
            raise ModelError(f"graph output {out.name!r} is not computed by any node")
        value = ctx.values[out.name]
        dtype = onnx_model.boundary_dtype(out, value.dtype)
        if dtype == "float16" and value.dtype != "float32":
            raise ModelError(f"graph output {out.name!r} is float16 in the model, its value "
                             f"is computed as {value.dtype}")
        outputs.append(_cast_at_boundary(ctx, value, dtype, out.name))
    if not outputs:
        raise ModelError("the model has no outputs")
    return outputs


def _consumers(graph) -> set:
    """The names the graph's nodes read, those of their subgraphs (If's branches, Loop's
    bodies) included."""
    names = set()
    for node in graph.node:
        names |= _reads(node)
    return names


def _reads(node) -> set:
    """The names ``node`` reads, in its subgraphs too (outer-scope values)."""
    names = {name for name in node.input if name}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            names |= _consumers(sub) | {out.name for out in sub.output}
    return names


def _with_params(inputs, outputs, initializers):
    """The graph with every initializer still used turned into a ``param`` node, and the
    params dict (name -> ndarray), as TVM returns them."""
    func = ir.Function(inputs, outputs)
    params, seen = {}, {}
    originals = {id(c): name for name, c in initializers.items()}
    for node in func.topo():
        node.inputs = tuple(_as_param(i, originals, params, seen) for i in node.inputs)
    func.outputs = [_as_param(o, originals, params, seen) for o in func.outputs]
    return ir.IRModule(func), params


def _as_param(node, originals, params, seen):
    if not node.is_const or id(node) not in originals:
        return node
    if id(node) not in seen:
        name = originals[id(node)]
        params[name] = node.value
        seen[id(node)] = ir.Node("param", (), {}, node.shape, node.dtype, name)
    return seen[id(node)]
