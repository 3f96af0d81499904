"""Graph passes run by ``relay.build``: bind the params, fold constants, merge common
computations, move reshapes that
only insert or remove unit dimensions past elementwise operators (so that the pair around a
1-D layer cancels), fold per-channel scales (batch normalization) into the producing
convolution or dense layer, merge constant additions, compute a convolution whose windows
tile its input as a matrix product. Each pass returns a new
:class:`~kernelrpc.relay.ir.Function`; nodes are rebuilt, never edited in place, so the module
the user holds is left as it was.
"""
from __future__ import annotations

import numpy as np

from . import ir
from .errors import ModelError
from .op import get as get_op


def rewrite(func: ir.Function, visit, uses: dict | None = None) -> ir.Function:
    """Rebuild ``func`` bottom-up; ``visit(node, new_inputs)`` returns the replacement. With
    ``uses`` (see :func:`_consumers`), each replacement takes its original's count of uses."""
    new = {}
    for node in func.topo():
        inputs = tuple(new[id(i)] for i in node.inputs)
        new[id(node)] = visit(node, inputs)
        if uses is not None:
            uses[id(new[id(node)])] = uses.get(id(node), 0)
    return ir.Function([new[id(i)] for i in func.inputs], [new[id(o)] for o in func.outputs],
                       func.name)


def with_inputs(node: ir.Node, inputs) -> ir.Node:
    """``node`` over ``inputs`` (itself when they are its own)."""
    if inputs == node.inputs:
        return node
    return ir.Node(node.op, inputs, node.attrs, node.shape, node.dtype, node.name, node.value,
                   node.origin)


def with_layout(node: ir.Node, inputs, kernel_layout: str, **attrs) -> ir.Node:
    """``node`` over ``inputs``, its weight in ``kernel_layout`` (and ``attrs`` besides)."""
    return ir.Node(node.op, tuple(inputs), {**node.attrs, "kernel_layout": kernel_layout, **attrs},
                   node.shape, node.dtype, node.name, origin=node.origin)


def bind_params(func: ir.Function, params: dict | None) -> ir.Function:
    params = {} if params is None else dict(params)
    missing = []

    def visit(node, inputs):
        if node.op != "param":
            return with_inputs(node, inputs)
        if node.name not in params:
            missing.append(node.name)
            return node
        given = params[node.name]
        value = np.asarray(given.numpy() if hasattr(given, "numpy") else given)  # a device tensor
        if tuple(value.shape) != node.shape or value.dtype.name != node.dtype:
            raise ModelError(f"param {node.name!r} is {value.dtype}{list(value.shape)}, the model "
                             f"expects {node.dtype}{list(node.shape)}")
        return ir.const(value, node.name)
    out = rewrite(func, visit)
    if missing:
        raise ModelError(f"no value for param(s) {', '.join(map(repr, missing))}: pass "
                         "relay.build(mod, params=params) with the params from_onnx returned")
    return out


def fold_constants(func: ir.Function) -> ir.Function:
    def visit(node, inputs):
        opdef = get_op(node.op) if node.op not in ("input", "param", "const") else None
        if opdef is not None and inputs and all(i.is_const for i in inputs) and opdef.fold:
            value = np.asarray(opdef.fold([i.value for i in inputs], node.attrs))
            return ir.const(value.astype(node.dtype, copy=False).reshape(node.shape), node.name)
        return with_inputs(node, inputs)
    return rewrite(func, visit)


def _consumers(func: ir.Function) -> dict:
    count: dict = {}
    for node in func.topo():
        for i in node.inputs:
            count[id(i)] = count.get(id(i), 0) + 1
    for o in func.outputs:
        count[id(o)] = count.get(id(o), 0) + 1
    return count


def _channel_vector(node: ir.Node, channels: int, axis: int, ndim: int):
    """The per-channel values of a constant that broadcasts along ``axis`` only, or None."""
    if not node.is_const:
        return None
    value = node.value
    if value.ndim > ndim:
        return None
    shape = (1,) * (ndim - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(shape) if k != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(shape[axis]), (channels,))


def fold_scale_axis(func: ir.Function) -> ir.Function:
    """``conv(x, W) * c`` -> ``conv(x, W * c)`` and ``(conv(x, W) + b) * c`` ->
    ``conv(x, W * c) + b * c`` for per-output-channel constants ``c`` (batch normalization's
    scale), and the same for dense layers; then ``(y + b1) + b2`` -> ``y + (b1 + b2)``."""
    uses = _consumers(func)

    def producer_weight(node):
        if node.op == "nn.conv2d" and node.inputs[1].is_const:
            return 1, 4, 0
        if node.op == "nn.dense" and node.inputs[1].is_const:
            return 1, 2, 1
        return None

    def visit(node, inputs):
        node = with_inputs(node, inputs)
        if node.op == "multiply":
            for k in (0, 1):
                y, c = node.inputs[k], node.inputs[1 - k]
                if y.shape != node.shape or uses.get(id(y), 0) > 1:
                    continue
                bias = None
                if y.op == "add" and uses.get(id(y.inputs[0]), 0) == 1:
                    bias, y = y.inputs[1], y.inputs[0]
                info = producer_weight(y)
                if info is None:
                    continue
                axis = 1
                vector = _channel_vector(c, y.shape[axis], axis, len(y.shape))
                if vector is None or (bias is not None and _channel_vector(
                        bias, y.shape[axis], axis, len(y.shape)) is None):
                    continue
                wpos, wdim, waxis = info
                weight = y.inputs[wpos].value
                shape = [1] * wdim
                shape[waxis] = -1
                scaled = (weight * vector.reshape(shape)).astype(weight.dtype)
                out = ir.Node(y.op, (y.inputs[0], ir.const(scaled, y.inputs[wpos].name)),
                              y.attrs, y.shape, y.dtype, y.name, origin=y.origin + node.origin)
                if bias is not None:
                    scaled_bias = (bias.value * c.value).astype(bias.dtype)
                    out = ir.Node("add", (out, ir.const(scaled_bias)), {}, out.shape, out.dtype,
                                  node.name, origin=("Add",))
                return out
        if node.op == "add":
            y, c = node.inputs
            if y.op == "add" and c.is_const and y.inputs[1].is_const and \
                    uses.get(id(y), 0) == 1 and y.shape == node.shape:
                merged = np.asarray(y.inputs[1].value + c.value).astype(node.dtype)
                if merged.ndim <= len(node.shape):
                    return ir.Node("add", (y.inputs[0], ir.const(merged)), {}, node.shape,
                                   node.dtype, node.name, origin=y.origin + node.origin)
        return node
    return rewrite(func, visit, uses)


#: fewest multiply-adds an output of a patch convolution sums (input channels x window) for
#: :func:`patches_as_rows` to take it, and the narrowest window: a patch's row a whole vector
#: of 8 lanes, so that the copy into rows runs in vectors. Zen 2 core, AVX2, one | two
#: threads, rows against the convolution: 3 -> 128 8x8/8 on 224x224 (192) 0.91 | 0.96; but
#: windows of 2 and 4 columns, copied element by element: 96 -> 192 2x2/2 on 56x56 0.83 |
#: 1.03, 64 -> 128 2x2/2 0.98 | 1.39, the 3 -> 96 4x4/4 stems of Swin and ConvNeXt 1.25 | 1.62
PATCH_MIN_REDUCTION = 192
PATCH_MIN_WIDTH = 8


def _tiles_its_input(node: ir.Node) -> bool:
    """A float convolution whose windows tile its input: kernel = strides (at least
    :data:`PATCH_MIN_WIDTH` columns), no padding, dilation, upsampling or groups, a constant
    weight, the map a whole number of windows (a ViT's patch embedding)."""
    if node.op != "nn.conv2d" or "kernel_layout" in node.attrs or "upsample" in node.attrs:
        return False
    data, weight = node.inputs[:2]
    _, channels, kh, kw = weight.shape
    attrs = node.attrs
    return weight.is_const and node.dtype == "float32" and attrs["groups"] == 1 and \
        tuple(attrs["strides"]) == (kh, kw) and kw >= PATCH_MIN_WIDTH and \
        not any(attrs["padding"]) and tuple(attrs["dilation"]) == (1, 1) and \
        data.shape[2] % kh == 0 and data.shape[3] % kw == 0 and \
        channels * kh * kw >= PATCH_MIN_REDUCTION


def _made(op: str, inputs, attrs: dict, like: ir.Node, part: str = "") -> ir.Node:
    """A node standing for (part of) ``like``: its origin, its name (with ``.part``)."""
    shape, dtype = get_op(op).infer(list(inputs), attrs)
    return ir.Node(op, tuple(inputs), attrs, tuple(shape), dtype,
                   f"{like.name}.{part}" if part else like.name, origin=like.origin)


def patches_as_rows(func: ir.Function) -> ir.Function:
    """A convolution whose windows tile its input (:func:`_tiles_its_input`) as a matrix
    product: the patches as rows (a reshape, transpose and reshape, one copy in vectors), a
    dense layer of the weight as ``[C*kh*kw][O]`` (its panels laid out at build time), the rows
    back to NCHW. The dense layer's tile reads each weight vector once for six patches where
    the convolution's tiles broadcast an input value per output (ViT's 16x16/16 stem, 3 ->
    256 channels on 224x224, Zen 2 core, AVX2: 912 -> 842 us, onnxruntime 883; two threads
    622 -> 490, onnxruntime 467)."""
    def visit(node, inputs):
        node = with_inputs(node, inputs)
        if not _tiles_its_input(node):
            return node
        data, weight = node.inputs[:2]
        n, c, h, w = data.shape
        o, _, kh, kw = weight.shape
        grid = (h // kh, w // kw)
        rows = _made("reshape", [data], {"newshape": (n, c, grid[0], kh, grid[1], kw)}, node,
                     "windows")
        rows = _made("transpose", [rows], {"axes": (0, 2, 4, 1, 3, 5)}, node, "patches")
        rows = _made("reshape", [rows], {"newshape": (n * grid[0] * grid[1], c * kh * kw)},
                     node, "rows")
        matrix = np.ascontiguousarray(weight.value.reshape(o, -1).T)
        out = _made("nn.dense", [rows, ir.const(matrix, weight.name)], {}, node, "product")
        out = _made("reshape", [out], {"newshape": (n, *grid, o)}, node, "nhwc")
        return _made("transpose", [out], {"axes": (0, 3, 1, 2)}, node)
    return rewrite(func, visit)


def _unit_free(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def _is_unit_reshape(node: ir.Node) -> bool:
    """A reshape that only inserts or removes dimensions of size 1."""
    return node.op == "reshape" and len(node.inputs[0].shape) != len(node.shape) and \
        _unit_free(node.inputs[0].shape) == _unit_free(node.shape)


def _unit_reshaped_const(node: ir.Node, shape: tuple, to: tuple) -> ir.Node | None:
    """The constant that broadcasts against ``to`` as ``node`` does against ``shape`` (each
    dimension of ``shape`` but those of size 1 is one of ``to``, in order), or None."""
    value = node.value
    if value.ndim > len(shape):
        return None
    padded = (1,) * (len(shape) - value.ndim) + value.shape
    along = iter(d for d, s in zip(padded, shape, strict=True) if s != 1)
    if any(d != 1 for d, s in zip(padded, shape, strict=True) if s == 1):
        return None
    return ir.const(value.reshape([1 if t == 1 else next(along) for t in to]), node.name)


def _sinkable(node: ir.Node) -> bool:
    """An operator computing each element from the same element of its operands, whatever
    their rank (broadcasting aside): no axis attribute, no quantization parameters."""
    pattern = get_op(node.op).pattern if node.op not in ("input", "param", "const") else None
    return pattern in ("elemwise", "broadcast") and not node.op.startswith("qnn.") and \
        "axis" not in node.attrs


#: operators reducing every dimension after the first two, whatever their number: a reshape
#: that only inserts or removes unit dimensions among those moves past them
_TRAILING_REDUCTIONS = ("nn.global_pool",)


def _past_trailing_reduction(node: ir.Node) -> ir.Node | None:
    """``reduce(reshape(y))`` -> ``reshape(reduce(y))`` when the reshape keeps the first two
    dimensions, else None."""
    (x,) = node.inputs
    if not _is_unit_reshape(x) or x.inputs[0].shape[:2] != x.shape[:2] or \
            len(x.inputs[0].shape) < 3:
        return None
    y = x.inputs[0]
    inside = ir.Node(node.op, (y,), node.attrs, (*y.shape[:2], *[1] * (len(y.shape) - 2)),
                     node.dtype, node.name, origin=node.origin)
    return ir.Node("reshape", (inside,), {"newshape": node.shape}, node.shape, node.dtype,
                   node.name, origin=x.origin)


def sink_unit_reshapes(func: ir.Function) -> ir.Function:
    """``f(reshape(y), c)`` -> ``reshape(f(y, c'))`` for an elementwise ``f`` and a reshape
    that only inserts or removes unit dimensions (``c'``: the constants reshaped alike), then
    ``reshape(reshape(y))`` -> ``reshape(y)``, and a reshape to its input's shape dropped. A 1-D
    layer is imported as a 2-D one of unit height between two such reshapes: moved past its
    bias, batch normalization and activation, the reshape meets the next layer's and both
    vanish, so that the scale folds into the convolution and the tail fuses as in 2-D; global
    pooling reads the unit-height map itself too."""
    def visit(node, inputs):
        node = with_inputs(node, inputs)
        if node.op in _TRAILING_REDUCTIONS:
            return _past_trailing_reduction(node) or node
        if node.op == "reshape":
            source = node.inputs[0]
            while source.op == "reshape":
                source = source.inputs[0]
            if source.shape == node.shape:
                return source
            return with_inputs(node, (source,))
        if not _sinkable(node):
            return node
        moved = [i for i in node.inputs if _is_unit_reshape(i)]
        if not moved or moved[0].shape != node.shape:
            return node
        inner = moved[0].inputs[0].shape
        operands = []
        for i in node.inputs:
            if i.is_const:
                operand = _unit_reshaped_const(i, node.shape, inner)
            elif i.shape == node.shape and _is_unit_reshape(i) and i.inputs[0].shape == inner:
                operand = i.inputs[0]
            else:
                operand = None
            if operand is None:
                return node
            operands.append(operand)
        inside = ir.Node(node.op, tuple(operands), node.attrs, inner, node.dtype, node.name,
                         origin=node.origin)
        return ir.Node("reshape", (inside,), {"newshape": node.shape}, node.shape, node.dtype,
                       node.name, origin=moved[0].origin)
    return rewrite(func, visit)


#: constants of at most this many elements are one node for each value (shapes, scalars, zero
#: points: an exporter writes one for each operator that takes it)
MERGED_CONST_SIZE = 64


def merge_common(func: ir.Function) -> ir.Function:
    """One node for each distinct computation: an operator of the same attributes over the
    same inputs, a small constant of the same value. An exporter writes what a tensor's
    readers each need once for each of them: the BERT-style encoder's dynamically quantized
    query, key and value layers each reshape, measure and quantize the same tokens."""
    seen = {}

    def visit(node, inputs):
        node = with_inputs(node, inputs)
        key = _computation(node)
        return node if key is None else seen.setdefault(key, node)
    return rewrite(func, visit)


def _computation(node: ir.Node):
    """What makes ``node`` the same as another, or None where only itself is."""
    if node.op in ("input", "param"):
        return None
    if node.is_const:
        value = node.value
        return None if value.size > MERGED_CONST_SIZE else \
            ("const", node.dtype, node.shape, value.tobytes())
    if any(isinstance(v, np.ndarray) for v in node.attrs.values()):
        return None
    return (node.op, tuple(id(i) for i in node.inputs), repr(sorted(node.attrs.items())),
            node.shape, node.dtype)


def optimize(func: ir.Function, params: dict | None) -> ir.Function:
    func = bind_params(func, params)
    func = merge_common(fold_constants(func))
    func = sink_unit_reshapes(func)
    for _ in range(3):       # BN after a bias-less conv is mul then add: two rounds reach both
        func = fold_scale_axis(func)
    return fold_constants(patches_as_rows(func))
