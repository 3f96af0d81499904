"""ONNX models to the network graph (TVM's ``relay.frontend.from_onnx``).

Every node is converted by the function registered for its operator type; each converter
reads the attributes it implements through :class:`Attrs`, which refuses any other attribute
that is set, so nothing is silently ignored. Before any conversion the whole graph is checked
for operators without a converter, and all of them are reported at once. Nodes whose inputs
are all constant are evaluated on the spot (shape arithmetic: Shape, Gather, Concat...).
"""
from __future__ import annotations



from .. import ir
from ..errors import ModelError, UnsupportedOperatorError
from . import onnx_elementwise, onnx_model, onnx_nn, onnx_tensor  # noqa: F401  (they register)
from . import onnx_activation, onnx_norm, onnx_reduce  # noqa: F401  (they register)
from . import onnx_recurrent  # noqa: F401  (it registers)
from . import onnx_quant  # noqa: F401  (it registers)
from .onnx_common import CONVERTERS, Attrs, Context, Unsupported, supported_operators

__all__ = ["from_onnx", "supported_operators"]


def from_onnx(model, shape: dict | None = None, dtype="float32", opset: int | None = None,
              freeze_params: bool = True):
    """Import an ONNX model: returns ``(mod, params)`` as TVM's ``relay.frontend.from_onnx``.

    Args:
        model: an ``onnx.ModelProto``, a path to a ``.onnx`` file, or its bytes.
        shape: input name -> static shape, required for inputs with dynamic dimensions.
        dtype: input dtype (a string, or a dict by input name) where the model has none.
        opset: override the model's opset (as TVM's).
        freeze_params: accepted for TVM's signature; weights are always constants to the graph.

    Raises:
        UnsupportedOperatorError: every operator (and operator use) that cannot be compiled.
        MissingShapeError: an input has a dynamic dimension and ``shape`` does not give it.
        ModelError: a malformed or inconsistent model.
    """
    model = onnx_model.load(model)
    opset = int(opset) if opset is not None else onnx_model.default_opset(model)
    onnx_model.check_opset(opset)
    graph = model.graph
    if len(graph.node) > onnx_model.MAX_NODES:
        raise ModelError(f"the model has {len(graph.node)} nodes; at most {onnx_model.MAX_NODES}")
    shape = dict(shape or {})
    _check_operators(graph, opset)
    ctx = Context(opset)
    initializers = {}
    for init in graph.initializer:
        value = onnx_model.tensor_value(init, f"initializer {init.name!r}")
        initializers[init.name] = ctx.values[init.name] = ir.const(value, init.name)
    inputs = []
    for info in graph.input:
        if info.name in initializers:
            continue
        given = shape.pop(info.name, None)
        in_shape = onnx_model.input_shape(info, given)
        elem = info.type.tensor_type.elem_type
        in_dtype = onnx_model.elem_dtype(elem, f"input {info.name!r}") if elem else (
            dtype.get(info.name, "float32") if isinstance(dtype, dict) else dtype)
        node = ir.Node("input", (), {}, in_shape, in_dtype, info.name)
        ctx.values[info.name] = node
        inputs.append(node)
    if shape:
        raise ModelError(f"shape= names {', '.join(map(repr, shape))}, which "
                         f"{'is not an input' if len(shape) == 1 else 'are not inputs'} of the "
                         f"model (inputs: {', '.join(repr(i.name) for i in inputs) or 'none'})")
    consumed = _consumers(graph)
    failures, poisoned = [], set()     # outputs that failed nodes did not compute
    for index, node in enumerate(graph.node):
        ctx.node_name = node.name or f"{node.op_type}_{index}"
        ctx.op_type = node.op_type
        ctx.outputs_wanted = len(node.output)
        if any(name in poisoned for name in node.input):
            poisoned.update(node.output)       # the cause is reported already
            continue
        args = []
        for name in node.input:
            if not name:
                args.append(None)
                continue
            if name not in ctx.values:
                raise ModelError(f"node {ctx.node_name!r} ({node.op_type}) reads {name!r}, which "
                                 "no earlier node, input or initializer defines (the graph is not "
                                 "in topological order or is incomplete)")
            args.append(ctx.values[name])
        if node.domain in _ONNX_DOMAINS:
            onnx_model.check_node_form(node, opset, f"node {ctx.node_name!r} ({node.op_type})")
        attrs = Attrs(node)
        try:
            outputs = CONVERTERS[_converter_name(node)](ctx, args, attrs)
            attrs.done()
        except Unsupported as exc:
            failures.append((node.op_type, ctx.node_name, opset, str(exc)))
            poisoned.update(node.output)
            continue
        except ModelError as exc:
            raise ModelError(f"node {ctx.node_name!r} ({node.op_type}): {exc}") from None
        for k, name in enumerate(node.output):
            if not name:
                continue
            if k >= len(outputs):
                if name in consumed or name in {o.name for o in graph.output}:
                    failures.append((node.op_type, ctx.node_name, opset,
                                     f"output {k} ({name!r}) is not implemented"))
                    poisoned.add(name)
                continue
            ctx.values[name] = outputs[k]
    if failures:
        raise UnsupportedOperatorError(failures)
    outputs = []
    for out in graph.output:
        if out.name not in ctx.values:
            raise ModelError(f"graph output {out.name!r} is not computed by any node")
        outputs.append(ctx.values[out.name])
    if not outputs:
        raise ModelError("the model has no outputs")
    return _with_params(inputs, outputs, initializers)


def _check_operators(graph, opset) -> None:
    missing = []
    for index, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}_{index}"
        if _converter_name(node) not in CONVERTERS and node.domain not in _ONNX_DOMAINS:
            missing.append((f"{node.domain}.{node.op_type}", name, opset,
                            "operators of custom domains are not supported"))
        elif _converter_name(node) not in CONVERTERS:
            missing.append((node.op_type, name, opset, "no converter"))
        elif node.domain in _ONNX_DOMAINS and \
                not onnx_model.operator_version_known(node.op_type, opset):
            missing.append((node.op_type, name, opset, "this version of the operator (newer "
                            f"than opset {onnx_model.MAX_OPSET}'s) is not implemented"))
    if missing:
        raise UnsupportedOperatorError(missing)


_ONNX_DOMAINS = ("", "ai.onnx")


def _converter_name(node) -> str:
    """An ONNX operator's type; another domain's (onnxruntime's ``com.microsoft``) prefixed
    by its domain (its converter checks the node's form: ONNX has no schema of it)."""
    return node.op_type if node.domain in _ONNX_DOMAINS else f"{node.domain}.{node.op_type}"


def _consumers(graph) -> set:
    return {name for node in graph.node for name in node.input if name}


def _with_params(inputs, outputs, initializers):
    """The graph with every initializer still used turned into a ``param`` node, and the
    params dict (name -> ndarray), as TVM returns them."""
    func = ir.Function(inputs, outputs)
    params, seen = {}, {}
    originals = {id(c): name for name, c in initializers.items()}
    for node in func.topo():
        node.inputs = tuple(_as_param(i, originals, params, seen) for i in node.inputs)
    func.outputs = [_as_param(o, originals, params, seen) for o in func.outputs]
    func.params = list(seen.values())
    return ir.IRModule(func), params


def _as_param(node, originals, params, seen):
    if not node.is_const or id(node) not in originals:
        return node
    if id(node) not in seen:
        name = originals[id(node)]
        params[name] = node.value
        seen[id(node)] = ir.Node("param", (), {}, node.shape, node.dtype, name)
    return seen[id(node)]
