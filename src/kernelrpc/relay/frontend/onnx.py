"""ONNX models to the network graph (TVM's ``relay.frontend.from_onnx``).

Every node is converted by the function registered for its operator type; each converter
reads the attributes it implements through :class:`Attrs`, which refuses any other attribute
that is set, so nothing is silently ignored. Before any conversion the whole graph is checked
for operators without a converter, and all of them are reported at once. Nodes whose inputs
are all constant are evaluated on the spot (shape arithmetic: Shape, Gather, Concat...).
"""
from __future__ import annotations

import math

import numpy as np

from .. import ir
from ..errors import ModelError, UnsupportedOperatorError
from ..op import get as get_op
from . import onnx_model

CONVERTERS: dict = {}


def converter(*op_types):
    def register(fn):
        for op_type in op_types:
            CONVERTERS[op_type] = fn
        return fn
    return register


def supported_operators() -> list[str]:
    return sorted(CONVERTERS)


class Unsupported(ModelError):
    """Raised by a converter for an attribute value or input it does not implement."""


class Attrs:
    """A node's attributes, read by name; ``done()`` refuses the ones nobody read."""

    def __init__(self, node):
        from onnx import helper

        self._values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self._read = set()

    def get(self, name, default=None):
        self._read.add(name)
        value = self._values.get(name, default)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value

    def ints(self, name, default):
        value = self.get(name, default)
        return [int(v) for v in value] if value is not None else None

    def done(self):
        extra = sorted(map(str, set(self._values) - self._read))
        if extra:
            raise Unsupported(f"attribute(s) {', '.join(map(str, extra))} not implemented")


class Context:
    def __init__(self, opset: int):
        self.opset = opset
        self.values: dict = {}
        self.node_name = ""
        self.op_type = ""
        self.outputs_wanted = 1

    def make(self, op: str, inputs, **attrs) -> ir.Node:
        """A node of ``op`` (shape and dtype inferred); evaluated now when its inputs are all
        constants and the operator has a numpy form."""
        inputs = tuple(inputs)
        opdef = get_op(op)
        shape, dtype = opdef.infer(list(inputs), attrs)
        if all(i.is_const for i in inputs) and opdef.fold is not None:
            value = np.asarray(opdef.fold([i.value for i in inputs], attrs))
            if value.shape != tuple(shape):
                raise ModelError(f"{op}: folded value has shape {value.shape}, expected {shape}")
            return ir.const(value.astype(dtype, copy=False), self.node_name)
        return ir.Node(op, inputs, attrs, tuple(int(d) for d in shape), dtype, self.node_name,
                       origin=(self.op_type,))

    def constant(self, node: ir.Node, what: str) -> np.ndarray:
        if node is None or not node.is_const:
            raise Unsupported(f"{what} must be a constant (computed from the input's values at "
                              "run time is not supported)")
        return node.value


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
        onnx_model.check_node_form(node, opset, f"node {ctx.node_name!r} ({node.op_type})")
        attrs = Attrs(node)
        try:
            outputs = CONVERTERS[node.op_type](ctx, args, attrs)
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
        if node.domain not in ("", "ai.onnx"):
            missing.append((f"{node.domain}.{node.op_type}", name, opset,
                            "operators of custom domains are not supported"))
        elif node.op_type not in CONVERTERS:
            missing.append((node.op_type, name, opset, "no converter"))
        elif not onnx_model.operator_version_known(node.op_type, opset):
            missing.append((node.op_type, name, opset, "this version of the operator (newer "
                            f"than opset {onnx_model.MAX_OPSET}'s) is not implemented"))
    if missing:
        raise UnsupportedOperatorError(missing)


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


# ====================================================================== converters

def _axis(axis: int, ndim: int, what="axis") -> int:
    if not -ndim <= axis < ndim:
        raise ModelError(f"{what} {axis} is out of range for {ndim} dimensions")
    return axis % ndim


def _reshape(ctx, x, shape):
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return ctx.make("reshape", [x], newshape=shape)


def _spatial_pads(attrs, in_shape, kernel, strides, dilations, what):
    auto = attrs.get("auto_pad", "NOTSET")
    nsp = len(kernel)
    pads = attrs.ints("pads", [0] * (2 * nsp))
    if len(pads) != 2 * nsp or any(p < 0 for p in pads):
        raise ModelError(f"{what}: pads {pads} must be {2 * nsp} non-negative integers")
    if auto in ("NOTSET", ""):
        return pads
    if auto == "VALID":
        return [0] * (2 * nsp)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else large)
        end.append(large if auto == "SAME_UPPER" else small)
    return begin + end


def _pair(attrs, name, default, lo=1):
    """A 2-D attribute (strides, dilations, kernel_shape...): two integers of at least ``lo``."""
    values = attrs.ints(name, default)
    if values is None or len(values) != 2 or any(v < lo for v in values):
        raise ModelError(f"{name} {values} must be two integers of at least {lo}")
    return values


@converter("Conv")
def _conv(ctx, args, attrs):
    x, w = args[0], args[1]
    if len(x.shape) != 4:
        raise Unsupported(f"only 2-D convolution (4-D input) is implemented, input is "
                          f"{list(x.shape)}")
    if len(w.shape) != 4:
        raise ModelError(f"the weight of a 2-D convolution must be 4-D, got {list(w.shape)}")
    kernel = _pair(attrs, "kernel_shape", list(w.shape[2:]))
    if list(kernel) != list(w.shape[2:]):
        raise ModelError(f"kernel_shape {kernel} does not match the weight {list(w.shape)}")
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    groups = int(attrs.get("group", 1))
    if groups <= 0:
        raise ModelError(f"group {groups} must be positive")
    pads = _spatial_pads(attrs, x.shape[2:], kernel, strides, dilations, "Conv")
    out = ctx.make("nn.conv2d", [x, w], strides=tuple(strides), dilation=tuple(dilations),
                   padding=(pads[0], pads[1], pads[2], pads[3]), groups=groups)
    if len(args) > 2 and args[2] is not None:
        out = ctx.make("add", [out, _reshape(ctx, args[2], (1, args[2].size, 1, 1))])
    return [out]


@converter("ConvTranspose")
def _conv_transpose(ctx, args, attrs):
    x, w = args[0], args[1]
    if len(x.shape) != 4:
        raise Unsupported("only 2-D transposed convolution (4-D input) is implemented")
    weight = ctx.constant(w, "the weight of ConvTranspose")
    groups = int(attrs.get("group", 1))
    c, ocg, kh, kw = weight.shape
    if groups <= 0 or c % groups or c != x.shape[1]:
        raise ModelError(f"weight {list(weight.shape)}, {x.shape[1]} input channels and "
                         f"group={groups} do not agree")
    kernel = _pair(attrs, "kernel_shape", [kh, kw])
    if list(kernel) != [kh, kw]:
        raise ModelError(f"kernel_shape {kernel} does not match the weight")
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    out_pad = _pair(attrs, "output_padding", [0, 0], lo=0)
    out_shape = attrs.ints("output_shape", None)
    if out_shape is not None and (len(out_shape) not in (2, 4) or min(out_shape) <= 0):
        raise ModelError(f"output_shape {out_shape} must be 2 (or 4) positive integers")
    auto = attrs.get("auto_pad", "NOTSET")
    pads = attrs.ints("pads", [0, 0, 0, 0])
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    span = [(k - 1) * d + 1 for k, d in zip((kh, kw), dilations)]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = out_shape[-2:] if out_shape is not None else [
            size * s for size, s in zip(x.shape[2:], strides)]
        begin, end = [], []
        for size, s, sp, op, t in zip(x.shape[2:], strides, span, out_pad, target):
            total = s * (size - 1) + op + sp - t
            if total < 0:                             # more output than the kernel covers:
                begin.append(0)                       # the rest is added at the end
                end.append(total)
                continue
            upper = auto == "SAME_UPPER"
            begin.append(total // 2 if upper else total - total // 2)
            end.append(total - total // 2 if upper else total // 2)
        pads = begin + end
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    # a transposed convolution is a convolution over the input upsampled by the stride (zeros
    # between elements), padded by the kernel's span less the pads, with the flipped kernel
    flipped = weight.reshape(groups, c // groups, ocg, kh, kw).transpose(0, 2, 1, 3, 4)
    flipped = np.ascontiguousarray(flipped.reshape(groups * ocg, c // groups, kh, kw)[:, :, ::-1, ::-1])
    padding = (span[0] - 1 - pads[0], span[1] - 1 - pads[1],
               span[0] - 1 - pads[2] + out_pad[0], span[1] - 1 - pads[3] + out_pad[1])
    out = ctx.make("nn.conv2d", [x, ir.const(flipped, w.name)], strides=(1, 1),
                   dilation=tuple(dilations), padding=padding, groups=groups,
                   upsample=tuple(strides))
    if len(args) > 2 and args[2] is not None:
        out = ctx.make("add", [out, _reshape(ctx, args[2], (1, args[2].size, 1, 1))])
    return [out]


def _dense(ctx, a, b_value, name):
    """``a @ b`` for a 2-D constant ``b``; ``a`` of any rank >= 2 (leading dimensions folded)."""
    lead = a.shape[:-1]
    flat = _reshape(ctx, a, (math.prod(lead), a.shape[-1])) if len(a.shape) != 2 else a
    out = ctx.make("nn.dense", [flat, ir.const(np.ascontiguousarray(b_value), name)])
    return _reshape(ctx, out, (*lead, b_value.shape[1])) if len(a.shape) != 2 else out


@converter("Gemm")
def _gemm(ctx, args, attrs):
    a, b = args[0], args[1]
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ModelError(f"Gemm needs 2-D operands, got {list(a.shape)} and {list(b.shape)}")
    if trans_a:
        a = ctx.make("transpose", [a], axes=(1, 0))
    if b.is_const:
        value = b.value.T if trans_b else b.value
        out = _dense(ctx, a, value * np.asarray(alpha, value.dtype) if alpha != 1 else value,
                     b.name)
    else:
        if trans_b:
            b = ctx.make("transpose", [b], axes=(1, 0))
        out = ctx.make("nn.batch_matmul", [a, b])
        if alpha != 1:
            out = ctx.make("multiply", [out, ir.const(np.asarray(alpha, out.dtype))])
    if len(args) > 2 and args[2] is not None and beta != 0:
        c = args[2]
        if beta != 1:
            c = ctx.make("multiply", [c, ir.const(np.asarray(beta, c.dtype))])
        out = ctx.make("add", [out, c])
    return [out]


@converter("MatMul")
def _matmul(ctx, args, attrs):
    a, b = args
    if len(a.shape) == 1 or len(b.shape) == 1:
        a2 = _reshape(ctx, a, (1, a.shape[0])) if len(a.shape) == 1 else a
        b2 = _reshape(ctx, b, (b.shape[0], 1)) if len(b.shape) == 1 else b
        out = _matmul(ctx, [a2, b2], attrs)[0]
        shape = list(out.shape)
        if len(a.shape) == 1:
            shape.pop(-2)
        if len(b.shape) == 1:
            shape.pop(-1)
        return [_reshape(ctx, out, shape)]
    if b.is_const and len(b.shape) == 2:
        if a.shape[-1] != b.shape[0]:
            raise ModelError(f"MatMul of {list(a.shape)} and {list(b.shape)}")
        return [_dense(ctx, a, b.value, b.name)]
    return [ctx.make("nn.batch_matmul", [a, b])]


_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide",
           "Pow": "power"}


@converter(*_BINARY)
def _binary(ctx, args, attrs):
    a, b = args
    return [ctx.make(_BINARY[ctx.op_type], [a, b])]


@converter("Sum", "Max", "Min", "Mean")
def _variadic(ctx, args, attrs):
    op = {"Sum": "add", "Mean": "add", "Max": "maximum", "Min": "minimum"}[ctx.op_type]
    if not args or any(a is None for a in args):
        raise ModelError(f"{ctx.op_type} needs at least one input")
    out = args[0]
    for other in args[1:]:
        out = ctx.make(op, [out, other])
    if ctx.op_type == "Mean" and len(args) > 1:
        out = ctx.make("multiply", [out, ir.const(np.asarray(1 / len(args), out.dtype))])
    return [out]


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log",
          "Sqrt": "sqrt", "Neg": "negative", "Abs": "abs", "Floor": "floor", "Ceil": "ceil",
          "Reciprocal": "reciprocal", "HardSwish": "hard_swish"}


@converter(*_UNARY)
def _unary(ctx, args, attrs):
    return [ctx.make(_UNARY[ctx.op_type], [args[0]])]


@converter("LeakyRelu")
def _leaky(ctx, args, attrs):
    return [ctx.make("leaky_relu", [args[0]], alpha=float(attrs.get("alpha", 0.01)))]


@converter("HardSigmoid")
def _hard_sigmoid(ctx, args, attrs):
    return [ctx.make("hard_sigmoid", [args[0]], alpha=float(attrs.get("alpha", 0.2)),
                     beta=float(attrs.get("beta", 0.5)))]


@converter("PRelu")
def _prelu(ctx, args, attrs):
    x, slope = args
    neg = ctx.make("minimum", [x, ir.const(np.zeros((), x.dtype))])
    return [ctx.make("add", [ctx.make("relu", [x]), ctx.make("multiply", [neg, slope])])]


@converter("Clip")
def _clip(ctx, args, attrs):
    if ctx.opset < 11:
        lo, hi = attrs.get("min", None), attrs.get("max", None)
    else:
        lo = float(ctx.constant(args[1], "Clip's min").reshape(())) if len(args) > 1 and \
            args[1] is not None else None
        hi = float(ctx.constant(args[2], "Clip's max").reshape(())) if len(args) > 2 and \
            args[2] is not None else None
    return [ctx.make("clip", [args[0]], min=None if lo is None else float(lo),
                     max=None if hi is None else float(hi))]


@converter("Softmax", "LogSoftmax")
def _softmax(ctx, args, attrs):
    x = args[0]
    ndim = len(x.shape)
    axis = _axis(int(attrs.get("axis", -1 if ctx.opset >= 13 else 1)), ndim)
    log = ctx.op_type == "LogSoftmax"
    if ctx.opset >= 13 or axis == ndim - 1:
        return [ctx.make("nn.softmax", [x], axis=axis, log=log)]
    flat = _reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    out = ctx.make("nn.softmax", [flat], axis=1, log=log)
    return [_reshape(ctx, out, x.shape)]


@converter("BatchNormalization")
def _batch_norm(ctx, args, attrs):
    x = args[0]
    eps = float(attrs.get("epsilon", 1e-5))
    attrs.get("momentum")           # a training attribute: no effect on inference
    if int(attrs.get("training_mode", 0)):
        raise Unsupported("training_mode=1 (batch statistics) is not implemented")
    scale, bias, mean, var = (ctx.constant(a, f"BatchNormalization's {n}") for a, n in
                              zip(args[1:5], ("scale", "B", "mean", "var")))
    if len(x.shape) < 2 or any(v.shape != (x.shape[1],) for v in (scale, bias, mean, var)):
        raise ModelError(f"BatchNormalization of {list(x.shape)}: the statistics must have "
                         f"{x.shape[1] if len(x.shape) > 1 else '?'} entries")
    a = (scale / np.sqrt(var.astype(np.float64) + eps)).astype(x.dtype)
    b = (bias - mean * a).astype(x.dtype)
    shape = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
    out = ctx.make("multiply", [x, ir.const(a.reshape(shape))])
    out = ctx.make("add", [out, ir.const(b.reshape(shape))])
    out.origin = ("BatchNormalization",)
    return [out]


def _pool(ctx, args, attrs, kind):
    x = args[0]
    if len(x.shape) != 4:
        raise Unsupported(f"only 2-D pooling (4-D input) is implemented, input is {list(x.shape)}")
    kernel = _pair(attrs, "kernel_shape", None)
    strides = _pair(attrs, "strides", [1, 1])
    dilations = _pair(attrs, "dilations", [1, 1])
    pads = _spatial_pads(attrs, x.shape[2:], kernel, strides, dilations, ctx.op_type)
    ceil = int(attrs.get("ceil_mode", 0))
    include = int(attrs.get("count_include_pad", 0)) if kind == "avg" else 0
    if kind == "max" and int(attrs.get("storage_order", 0)):
        raise Unsupported("storage_order=1 is not implemented")
    if kind == "avg" and dilations != [1, 1]:
        raise Unsupported("dilated AveragePool is not implemented")
    return [ctx.make("nn.pool2d", [x], kind=kind, kernel=tuple(kernel), strides=tuple(strides),
                     dilation=tuple(dilations), padding=tuple(pads), ceil_mode=bool(ceil),
                     count_include_pad=bool(include))]


@converter("MaxPool")
def _max_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "max")


@converter("AveragePool")
def _avg_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "avg")


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx, args, attrs):
    kind = "max" if ctx.op_type == "GlobalMaxPool" else "avg"
    return [ctx.make("nn.global_pool", [args[0]], kind=kind)]


@converter("LRN")
def _lrn(ctx, args, attrs):
    size = int(attrs.get("size"))
    if size <= 0:
        raise ModelError(f"LRN size {size} must be positive")
    if len(args[0].shape) < 3:
        raise ModelError("LRN needs N, C and spatial dimensions")
    return [ctx.make("nn.lrn", [args[0]], size=size, alpha=float(attrs.get("alpha", 1e-4)),
                     beta=float(attrs.get("beta", 0.75)), bias=float(attrs.get("bias", 1.0)))]


@converter("Flatten")
def _flatten(ctx, args, attrs):
    x = args[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    if not 0 <= axis <= len(x.shape):
        raise ModelError(f"Flatten axis {axis} out of range")
    return [_reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


@converter("Reshape")
def _reshape_op(ctx, args, attrs):
    x = args[0]
    allowzero = int(attrs.get("allowzero", 0))
    spec = [int(v) for v in ctx.constant(args[1], "Reshape's shape").reshape(-1)]
    shape = []
    for k, d in enumerate(spec):
        if d == 0 and not allowzero:
            if k >= len(x.shape):
                raise ModelError(f"Reshape: 0 at position {k} copies a dimension "
                                 f"{list(x.shape)} does not have")
            d = x.shape[k]
        shape.append(d)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ModelError(f"Reshape: shape {spec} is not valid")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.size % known:
            raise ModelError(f"Reshape of {list(x.shape)} to {spec}: sizes do not divide")
        shape[shape.index(-1)] = x.size // known
    return [_reshape(ctx, x, shape)]


@converter("Squeeze", "Unsqueeze")
def _squeeze(ctx, args, attrs):
    x = args[0]
    if ctx.opset >= 13:
        axes = [int(v) for v in ctx.constant(args[1], "axes").reshape(-1)] \
            if len(args) > 1 and args[1] is not None else None
    else:
        axes = attrs.ints("axes", None)
    if ctx.op_type == "Squeeze":
        ndim = len(x.shape)
        if axes is None:
            axes = [k for k, d in enumerate(x.shape) if d == 1]
        axes = {_axis(a, ndim) for a in axes}
        if any(x.shape[a] != 1 for a in axes):
            raise ModelError(f"Squeeze of axes {sorted(axes)} of {list(x.shape)}: not all are 1")
        shape = [d for k, d in enumerate(x.shape) if k not in axes]
    else:
        if axes is None:
            raise ModelError("Unsqueeze needs axes")
        ndim = len(x.shape) + len(axes)
        axes = sorted(_axis(a, ndim) for a in axes)
        shape = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
    return [_reshape(ctx, x, shape)]


@converter("Transpose")
def _transpose(ctx, args, attrs):
    x = args[0]
    perm = attrs.ints("perm", list(reversed(range(len(x.shape)))))
    if sorted(perm) != list(range(len(x.shape))):
        raise ModelError(f"Transpose perm {perm} is not a permutation of {len(x.shape)} axes")
    return [ctx.make("transpose", [x], axes=tuple(perm))]


@converter("Concat")
def _concat(ctx, args, attrs):
    items = [a for a in args if a is not None]
    if not items:
        raise ModelError("Concat of nothing")
    axis = _axis(int(attrs.get("axis")), len(items[0].shape))
    if len(items) == 1:
        return [items[0]]
    return [ctx.make("concatenate", items, axis=axis)]


@converter("Split")
def _split(ctx, args, attrs):
    x = args[0]
    axis = _axis(int(attrs.get("axis", 0)), len(x.shape))
    if ctx.opset >= 13:
        split = [int(v) for v in ctx.constant(args[1], "Split's split").reshape(-1)] \
            if len(args) > 1 and args[1] is not None else None
    else:
        split = attrs.ints("split", None)
    num = attrs.get("num_outputs", None) if ctx.opset >= 18 else None
    if split is None:
        count = int(num) if num is not None else ctx.outputs_wanted
        size = x.shape[axis]
        part = -(-size // count)
        split = [min(part, size - k * part) for k in range(count)]
    if sum(split) != x.shape[axis] or any(s <= 0 for s in split):
        raise ModelError(f"Split of {x.shape[axis]} into {split}")
    outs, start = [], 0
    for s in split:
        outs.append(ctx.make("strided_slice", [x], slices=((axis, start, start + s, 1),)))
        start += s
    return outs


def _clamp_slice(start, end, step, dim):
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)


@converter("Slice")
def _slice(ctx, args, attrs):
    x = args[0]
    ndim = len(x.shape)
    if ctx.opset < 10:
        starts, ends = attrs.ints("starts", None), attrs.ints("ends", None)
        axes = attrs.ints("axes", list(range(len(starts or []))))
        steps = [1] * len(starts or [])
    else:
        def read(k, what):
            return [int(v) for v in ctx.constant(args[k], f"Slice's {what}").reshape(-1)] \
                if len(args) > k and args[k] is not None else None
        starts, ends, axes, steps = read(1, "starts"), read(2, "ends"), read(3, "axes"), \
            read(4, "steps")
        axes = axes if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
    if starts is None or ends is None or not len(starts) == len(ends) == len(axes) == len(steps):
        raise ModelError("Slice: starts, ends, axes and steps must have one entry per axis")
    slices = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = _axis(axis, ndim)
        if step == 0:
            raise ModelError("Slice step 0")
        dim = x.shape[axis]
        start, end = _clamp_slice(max(min(start, 2**62), -2**62), max(min(end, 2**62), -2**62),
                                  step, dim)
        if (start, end, step) != (0, dim, 1):
            slices.append((axis, start, end, step))
    if not slices:
        return [x]
    return [ctx.make("strided_slice", [x], slices=tuple(slices))]


@converter("Pad")
def _pad(ctx, args, attrs):
    x = args[0]
    ndim = len(x.shape)
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", "edge", "reflect"):
        raise Unsupported(f"mode={mode!r}")
    if ctx.opset < 11:
        pads = attrs.ints("pads", None)
        value = float(attrs.get("value", 0.0))
        axes = list(range(ndim))
    else:
        pads = [int(v) for v in ctx.constant(args[1], "Pad's pads").reshape(-1)]
        value = float(ctx.constant(args[2], "Pad's constant_value").reshape(())) \
            if len(args) > 2 and args[2] is not None else 0.0
        axes = [_axis(int(a), ndim) for a in ctx.constant(args[3], "Pad's axes").reshape(-1)] \
            if len(args) > 3 and args[3] is not None else list(range(ndim))
    if pads is None or len(pads) != 2 * len(axes):
        raise ModelError(f"Pad: pads {pads} must have two entries per padded axis")
    if any(p < 0 for p in pads):
        raise Unsupported("negative pads (cropping) are not implemented")
    before, after = [0] * ndim, [0] * ndim
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    if not any(before) and not any(after):
        return [x]
    return [ctx.make("pad", [x], before=tuple(before), after=tuple(after), mode=mode,
                     value=value)]


_REDUCE = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min"}


@converter(*_REDUCE)
def _reduce(ctx, args, attrs):
    x = args[0]
    ndim = len(x.shape)
    keep = bool(int(attrs.get("keepdims", 1)))
    axes_from_input = ctx.opset >= 18 or (ctx.op_type == "ReduceSum" and ctx.opset >= 13)
    if axes_from_input:
        noop = int(attrs.get("noop_with_empty_axes", 0))
        axes = [int(v) for v in ctx.constant(args[1], "axes").reshape(-1)] \
            if len(args) > 1 and args[1] is not None else []
        if not axes and noop:
            return [x]
    else:
        axes = attrs.ints("axes", [])
    axes = sorted({_axis(a, ndim) for a in axes}) if axes else list(range(ndim))
    return [ctx.make("reduce", [x], kind=_REDUCE[ctx.op_type], axes=tuple(axes), keepdims=keep)]


@converter("Dropout")
def _dropout(ctx, args, attrs):
    attrs.get("ratio")
    attrs.get("seed")
    if ctx.opset >= 12 and len(args) > 2 and args[2] is not None:
        training = ctx.constant(args[2], "Dropout's training_mode")
        if bool(training.reshape(())):
            raise Unsupported("training_mode=True is not implemented (inference only)")
    return [args[0]]


@converter("Identity")
def _identity(ctx, args, attrs):
    return [args[0]]


@converter("Constant")
def _constant(ctx, args, attrs):
    for name in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        value = attrs.get(name)
        if value is None:
            continue
        if name == "value":
            value = onnx_model.tensor_value(value, f"Constant {ctx.node_name!r}")
        else:
            value = np.asarray(value, dtype=np.float32 if "float" in name else np.int64)
        return [ir.const(value, ctx.node_name)]
    for name in ("sparse_value", "value_string", "value_strings"):
        if attrs.get(name) is not None:
            raise Unsupported(f"Constant with {name}")
    raise ModelError("Constant without a value")


@converter("ConstantOfShape")
def _constant_of_shape(ctx, args, attrs):
    shape = [int(v) for v in ctx.constant(args[0], "ConstantOfShape's shape").reshape(-1)]
    if any(d < 0 for d in shape) or math.prod(shape) > onnx_model.MAX_TENSOR_BYTES // 8:
        raise ModelError(f"ConstantOfShape of shape {shape}")
    value = attrs.get("value")
    fill = onnx_model.tensor_value(value, "ConstantOfShape's value").reshape(-1) \
        if value is not None else np.zeros(1, np.float32)
    return [ir.const(np.full(shape, fill[0], dtype=fill.dtype), ctx.node_name)]


@converter("Shape")
def _shape(ctx, args, attrs):
    dims = list(args[0].shape)
    start, end = int(attrs.get("start", 0)), attrs.get("end", None)
    if ctx.opset < 15 and (start != 0 or end is not None):
        raise ModelError("Shape's start/end need opset 15")
    return [ir.const(np.asarray(dims[start:None if end is None else int(end)], np.int64),
                     ctx.node_name)]


@converter("Size")
def _size(ctx, args, attrs):
    return [ir.const(np.asarray(args[0].size, np.int64), ctx.node_name)]


@converter("Gather")
def _gather(ctx, args, attrs):
    x, indices = args
    axis = _axis(int(attrs.get("axis", 0)), len(x.shape))
    index = ctx.constant(indices, "Gather's indices")
    if index.dtype.kind not in "iu":
        raise ModelError("Gather's indices must be integers")
    dim = x.shape[axis]
    if index.size and (index.min() < -dim or index.max() >= dim):
        raise ModelError(f"Gather index out of range for a dimension of {dim}")
    if x.is_const:
        return [ir.const(np.take(x.value, index, axis=axis), ctx.node_name)]
    return [ctx.make("take", [x, ir.const(index.astype(np.int32))], axis=axis)]


@converter("Cast")
def _cast(ctx, args, attrs):
    dtype = onnx_model.elem_dtype(int(attrs.get("to")), "Cast's to")
    attrs.get("saturate")
    x = args[0]
    if x.dtype == dtype:
        return [x]
    return [ctx.make("cast", [x], dtype=dtype)]


@converter("Resize", "Upsample")
def _resize(ctx, args, attrs):
    x = args[0]
    if len(x.shape) != 4:
        raise Unsupported("only 4-D (NCHW) Resize is implemented")
    mode = attrs.get("mode", "nearest")
    if ctx.op_type == "Upsample" or ctx.opset < 11:
        scales = ctx.constant(args[1], "scales").astype(np.float64) if len(args) > 1 else \
            np.asarray(attrs.get("scales"), np.float64)
        sizes, coord, nearest = None, "asymmetric", "floor"
    else:
        coord = attrs.get("coordinate_transformation_mode", "half_pixel")
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
        if float(attrs.get("cubic_coeff_a", -0.75)) != -0.75 and mode == "cubic":
            raise Unsupported("cubic Resize")
        if int(attrs.get("exclude_outside", 0)):
            raise Unsupported("exclude_outside=1")
        attrs.get("extrapolation_value")
        if int(attrs.get("antialias", 0)):
            raise Unsupported("antialias=1")
        if attrs.get("axes", None) is not None:
            raise Unsupported("Resize with axes")
        if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise Unsupported("keep_aspect_ratio_policy other than 'stretch'")
        scales = args[2].value.astype(np.float64) if len(args) > 2 and args[2] is not None \
            and args[2].is_const and args[2].size else None
        sizes = [int(v) for v in ctx.constant(args[3], "Resize's sizes").reshape(-1)] \
            if len(args) > 3 and args[3] is not None else None
        if len(args) > 2 and args[2] is not None and not args[2].is_const:
            raise Unsupported("scales computed at run time")
        if coord == "tf_crop_and_resize":
            raise Unsupported("coordinate_transformation_mode='tf_crop_and_resize'")
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"mode={mode!r}")
    if sizes is None:
        if scales is None or scales.size != 4:
            raise ModelError("Resize needs 4 scales or 4 sizes")
        if scales[0] != 1 or scales[1] != 1:
            raise Unsupported("resizing the batch or channel dimension")
        sizes = [int(math.floor(d * s)) for d, s in zip(x.shape, scales)]
    else:
        if len(sizes) != 4 or sizes[:2] != list(x.shape[:2]):
            raise Unsupported("resizing the batch or channel dimension")
        scales = np.asarray([s / d for s, d in zip(sizes, x.shape)], np.float64)
    if any(s <= 0 for s in sizes):
        raise ModelError(f"Resize to {sizes}")
    return [ctx.make("image.resize2d", [x], size=(sizes[2], sizes[3]),
                     scales=(float(scales[2]), float(scales[3])),
                     mode="nearest" if mode == "nearest" else "linear",
                     coordinate_transformation_mode=coord, nearest_mode=nearest)]
