"""ONNX converters of quantized models, in both formats ``onnxruntime.quantization`` writes.

QDQ: DequantizeLinear and QuantizeLinear around float operators. A DequantizeLinear becomes
``qnn.dequantize`` (a constant one, a weight, is folded and remembered with its integers);
at a QuantizeLinear, :func:`integer_form` looks back through the float operators it
quantizes and, where they are a convolution or dense layer (with its bias and a ReLU/Clip),
add, multiply, global average pooling, concatenation or data movement over dequantized
tensors, builds the integer operators of :mod:`kernelrpc.relay.op.quant` instead:
``quantize(conv(dequantize(x), dequantize(w)))`` becomes ``qnn.conv2d`` (int32 accumulation,
the requantization in its output stage), so activations stay int8 between layers. Anything
else stays dequantize, float operator, quantize, which is exact too.

QOperator: QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger are the float converter
over dequantized operands, put in integer form at once; DynamicQuantizeLinear computes its
scale and zero point at run time as onnxruntime does; QLinearAdd, QLinearMul,
QLinearGlobalAveragePool and QLinearConcat (onnxruntime's ``com.microsoft`` domain) likewise.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .. import ir
from ..errors import ModelError
from ..op import quant
from ..op.quant import QUANTIZED, qrange
from .onnx_common import Unsupported, converter, find_converter, normalize_axis, reshape

#: the float layers whose values quantization commutes with (it is monotonic and per tensor)
_MOVEMENT = ("reshape", "transpose", "nn.pool2d", "nn.global_pool", "copy")


def _float_converter(ctx, op_type: str):
    """The float operator's converter in the model's opset (a quantized layer's float form)."""
    return find_converter(op_type, ctx.opset)[1]


@dataclass(frozen=True)
class Quantized:
    """A quantized tensor as a layer reads it: its integers (a node), its scale (a float, or
    None where it is computed at run time) and zero point (a scalar node)."""

    value: ir.Node
    scale: float | None
    zero: ir.Node

    @property
    def zero_point(self) -> int | None:
        return int(self.zero.value.reshape(())) if self.zero.is_const else None


@dataclass(frozen=True)
class Output:
    """A QuantizeLinear's per-tensor parameters and the range a fused ReLU/Clip leaves."""

    scale: float
    zero: int
    dtype: str
    lo: int
    hi: int

    def attrs(self) -> dict:
        return {"out_zero": self.zero, "out_min": self.lo, "out_max": self.hi,
                "out_dtype": self.dtype}

    @property
    def full(self) -> bool:
        return (self.lo, self.hi) == qrange(self.dtype)


# ------------------------------------------------------------------ parameters


def _param_shape(scale: ir.Node, x: ir.Node, axis: int) -> tuple:
    """The shape a scale or zero point broadcasts as against ``x``: a scalar as is, a 1-D
    tensor along ``axis``."""
    if scale.size == 1:
        return ()
    axis = normalize_axis(axis, len(x.shape))
    if len(scale.shape) != 1 or scale.shape[0] != x.shape[axis]:
        raise ModelError(f"a per-axis scale or zero point of shape {list(scale.shape)} does not "
                         f"match axis {axis} of {list(x.shape)}")
    return tuple(x.shape[axis] if k == axis else 1 for k in range(len(x.shape)))


def _params(ctx, x, scale, zero, axis, dtype):
    """``(scale, zero point)`` nodes in their broadcast shapes; a missing zero point is 0 of
    ``dtype``."""
    if scale.dtype != "float32":
        raise Unsupported(f"a scale of {scale.dtype} (float32 is implemented)")
    if zero is None:
        zero = ir.const(np.zeros(scale.shape, dtype))
    if zero.shape != scale.shape and zero.size != scale.size:
        raise ModelError(f"zero point {list(zero.shape)} and scale {list(scale.shape)} differ")
    out = []
    for node in (scale, zero):
        shape = _param_shape(node, x, axis)
        if node.is_const:
            out.append(ir.const(node.value.reshape(shape), node.name))
        elif node.shape != shape:
            out.append(ctx.make("reshape", [node], newshape=shape))
        else:
            out.append(node)
    return out


def _constants(ctx) -> dict:
    """The dequantized constants met so far: the digest of their float values -> their
    integers, scale and zero point (each broadcasting to the shape)."""
    return vars(ctx).setdefault("quantized_constants", {})


def _digest(value: np.ndarray) -> tuple:
    value = np.ascontiguousarray(value)
    return value.shape, value.dtype.str, hashlib.sha1(value.tobytes()).digest()


def _remember(ctx, folded: ir.Node, integers, scale, zero):
    table = _constants(ctx)
    table[_digest(folded.value)] = (integers, scale, zero)
    if folded.value.ndim == 2:        # Gemm's transB reads the weight transposed
        table[_digest(folded.value.T)] = (integers.T, scale.T, zero.T)


def _constant_source(ctx, node: ir.Node):
    """``(integers, scale, zero point)`` of a constant a DequantizeLinear made, else None."""
    return _constants(ctx).get(_digest(node.value)) if node.is_const else None


def _per_channel(value: np.ndarray, shape: tuple, axis: int) -> np.ndarray | None:
    """``value`` (broadcasting to ``shape``) as one entry per index of ``axis``, or None where
    it varies along another axis."""
    value = np.asarray(value)
    if value.size == 1:
        return np.full(shape[axis], value.reshape(()))
    padded = (1,) * (len(shape) - value.ndim) + value.shape
    if any(d != 1 for k, d in enumerate(padded) if k != axis):
        return None
    return value.reshape(-1)


# ------------------------------------------------------------------ DequantizeLinear


@converter("DequantizeLinear")
def _dequantize(ctx, args, attrs):
    x, scale = args[:2]
    if x.dtype not in QUANTIZED + ("int32",):
        raise Unsupported(f"DequantizeLinear of {x.dtype} (int8, uint8, int32 are implemented)")
    return [_dequantized(ctx, x, scale, args[2] if len(args) > 2 else None,
                         int(attrs.get("axis", 1)))]


def _dequantized(ctx, x, scale, zero, axis=1):
    """``qnn.dequantize``; a constant one folded, and remembered with its integers."""
    scale_b, zero_b = _params(ctx, x, scale, zero, axis, x.dtype)
    out = ctx.make("qnn.dequantize", [x, scale_b, zero_b])
    if out.is_const:
        _remember(ctx, out, x.value, scale_b.value, zero_b.value)
    return out


def activation(node: ir.Node) -> Quantized | None:
    """The quantized tensor a float tensor dequantizes, per tensor: a ``qnn.dequantize``
    whose scale is a constant scalar (the zero point may be computed at run time)."""
    if node.op != "qnn.dequantize":
        return None
    x, scale, zero = node.inputs
    if x.dtype not in QUANTIZED or scale.size != 1 or zero.size != 1 or not scale.is_const:
        return None
    return Quantized(x, float(scale.value.reshape(())), zero)


def _weight(ctx, node: ir.Node, axis: int):
    """``(integers, scale per channel)`` of a constant weight quantized per tensor or along
    ``axis``: int8 as is where its zero point is 0, else centered (``w - zero`` in int16)."""
    found = _constant_source(ctx, node)
    if found is None:
        return None
    integers, scale, zero = found
    scales = _per_channel(scale, node.shape, axis)
    zeros = _per_channel(zero, node.shape, axis)
    if scales is None or zeros is None or integers.dtype not in QUANTIZED:
        return None
    if integers.dtype == "int8" and not zeros.any():
        return integers, scales.astype(np.float32)
    shape = [1] * node.value.ndim
    shape[axis] = -1
    centered = integers.astype(np.int16) - zeros.astype(np.int16).reshape(shape)
    return centered, scales.astype(np.float32)


def _integer_bias(value, scale) -> np.ndarray | None:
    """A dequantized bias back in the accumulator's units (``x_scale * w_scale``), where it is
    a whole number of them (as onnxruntime quantizes it); else None."""
    exact = np.rint(value.astype(np.float64) / scale.astype(np.float64))
    if np.abs(exact).max(initial=0) >= 2 ** 31 or not np.allclose(
            exact.astype(np.float32) * scale, value, rtol=1e-5, atol=0):
        return None
    return exact.astype(np.int32)


# ------------------------------------------------------------------ QuantizeLinear


@converter("QuantizeLinear")
def _quantize(ctx, args, attrs):
    x, scale = args[:2]
    zero = args[2] if len(args) > 2 else None
    dtype = zero.dtype if zero is not None else "uint8"
    if dtype not in QUANTIZED:
        raise Unsupported(f"QuantizeLinear to {dtype} (int8, uint8 are implemented)")
    if x.dtype != "float32":
        raise Unsupported(f"QuantizeLinear of {x.dtype} (float32 is implemented)")
    if int(attrs.get("saturate", 1)) != 1:
        raise Unsupported("saturate=0 (a float8 form)")
    scale_b, zero_b = _params(ctx, x, scale, zero, int(attrs.get("axis", 1)), dtype)
    if scale_b.is_const and zero_b.is_const and scale_b.size == 1:
        lo, hi = qrange(dtype)
        out = Output(float(scale_b.value.reshape(())), int(zero_b.value.reshape(())), dtype,
                     lo, hi)
        found = integer_form(ctx, x, out)
        if found is not None:
            return [found]
    return [ctx.make("qnn.quantize", [x, scale_b, zero_b], out_dtype=dtype)]


def _quantized_bound(value: float, out: Output) -> int:
    q = np.rint(np.float32(value) / np.float32(out.scale)) + out.zero
    return int(np.clip(q, *qrange(out.dtype)))


def integer_form(ctx, y: ir.Node, out: Output) -> ir.Node | None:
    """``quantize(y)`` as integer operators over the quantized tensors ``y`` is computed from,
    or None where ``y`` is not of a form that has one."""
    if y.op == "relu":
        return integer_form(ctx, y.inputs[0], _clamped(out, max(out.lo, out.zero), out.hi))
    if y.op == "clip":
        lo, hi = out.lo, out.hi
        if y.attrs.get("min") is not None:
            lo = max(lo, _quantized_bound(y.attrs["min"], out))
        if y.attrs.get("max") is not None:
            hi = min(hi, _quantized_bound(y.attrs["max"], out))
        return integer_form(ctx, y.inputs[0], _clamped(out, lo, hi)) if lo <= hi else None
    for rule in (_requantized, _conv, _dense, _binary, _global_average, _concat, _movement):
        found = rule(ctx, y, out)
        if found is not None:
            return found
    return None


def _like(ctx, y: ir.Node, op: str, inputs, **attrs) -> ir.Node:
    """An integer operator standing for the float layer ``y`` (its ONNX origin)."""
    node = ctx.make(op, inputs, **attrs)
    node.origin = y.origin
    return node


def _clamped(out: Output, lo: int, hi: int) -> Output:
    return Output(out.scale, out.zero, out.dtype, lo, hi)


def _requantized(ctx, y, out):
    """A dequantized tensor quantized again: itself, or requantized to other parameters."""
    source = activation(y)
    if source is None or source.zero_point is None:
        return None
    if (source.scale, source.zero_point, source.value.dtype) == (out.scale, out.zero, out.dtype) \
            and out.full:
        return source.value
    return ctx.make("qnn.requantize", [source.value], in_scale=source.scale,
                    in_zero=source.zero_point, out_scale=out.scale, **out.attrs())


def _anchor_and_bias(y, op: str, channels_at: int):
    """``(anchor, float bias per channel or None)`` of ``anchor`` or ``anchor + bias``."""
    if y.op == op:
        return y, None
    if y.op != "add" or y.inputs[0].op != op or not y.inputs[1].is_const:
        return None, None
    anchor, bias = y.inputs
    rank, channels = len(anchor.shape), anchor.shape[channels_at]
    along = bias.shape == (channels,) and channels_at == rank - 1 or \
        len(bias.shape) == rank and bias.shape[channels_at] == channels
    if bias.size != channels or not along:
        return None, None
    return anchor, bias.value.reshape(-1)


def _requantize_inputs(source: Quantized, scales, bias_f, out: Output | None):
    """The bias (int32) and multiplier (float32) constants of a requantized integer layer,
    or None where the bias is not in the accumulator's units."""
    if out is None:
        return []
    if source.scale is None:
        return None
    product = np.float32(source.scale) * scales
    bias = np.zeros(scales.shape, np.int32) if bias_f is None else _integer_bias(bias_f, product)
    if bias is None:
        return None
    return [ir.const(bias), ir.const((product / np.float32(out.scale)).astype(np.float32))]


def _conv(ctx, y, out: Output | None):
    conv, bias_f = _anchor_and_bias(y, "nn.conv2d", 1)
    if conv is None or "upsample" in conv.attrs or "kernel_layout" in conv.attrs or \
            (out is None and bias_f is not None):
        return None
    source, weight = activation(conv.inputs[0]), _weight(ctx, conv.inputs[1], 0)
    if source is None or weight is None:
        return None
    extra = _requantize_inputs(source, weight[1], bias_f, out)
    if extra is None:
        return None
    integers, attrs = weight[0], {**conv.attrs, **(out.attrs() if out else _INT32)}
    if extra and conv.attrs["groups"] == 1 and integers.dtype == np.int8 and \
            source.zero_point is not None:
        extra[0] = ir.const(quant.packed_bias(extra[0].value, integers, source.value.dtype,
                                              source.zero_point))
        attrs["kernel_layout"] = quant.PACKED       # its form is the build's choice
        integers = quant.pack_weight(integers)
    return _like(ctx, conv, "qnn.conv2d", [source.value, ir.const(integers), source.zero, *extra],
                 **attrs)


_INT32 = {"out_zero": 0, "out_min": 0, "out_max": 0, "out_dtype": "int32"}


def _dense(ctx, y, out: Output | None):
    dense, bias_f = _anchor_and_bias(y, "nn.dense", 1)
    if dense is None or (out is None and bias_f is not None):
        return None
    data = dense.inputs[0]
    source, flattened = activation(data), None
    if source is None and data.op == "reshape":      # MatMul of N-D data: its rows flattened
        source, flattened = activation(data.inputs[0]), data
    weight = _weight(ctx, dense.inputs[1], 1)
    if source is None or weight is None:
        return None
    extra = _requantize_inputs(source, weight[1], bias_f, out)
    if extra is None:
        return None
    integers, attrs, rows = weight[0], dict(out.attrs() if out else _INT32), source.value
    if integers.dtype == np.int8:   # packed (reads N-D rows), its column sums for the zero point
        attrs["kernel_layout"] = quant.PACKED_DENSE
        operands = [ir.const(quant.pack_dense_weight(integers)), source.zero,
                    ir.const(integers.astype(np.int32).sum(axis=0, dtype=np.int32))]
    else:
        operands = [ir.const(integers), source.zero]
        if flattened is not None:
            rows = ctx.make("reshape", [rows], **flattened.attrs)
    return reshape(ctx, _like(ctx, dense, "qnn.dense", [rows, *operands, *extra], **attrs),
                   y.shape)


def _binary(ctx, y, out: Output):
    if y.op not in ("add", "multiply"):
        return None
    a, b = (activation(i) or _constant_activation(ctx, i) for i in y.inputs)
    if a is None or b is None or a.zero_point is None or b.zero_point is None:
        return None
    return _like(ctx, y, "qnn.binary", [a.value, b.value], kind="add" if y.op == "add" else "mul",
                    a_scale=a.scale, a_zero=a.zero_point, b_scale=b.scale,
                    b_zero=b.zero_point, out_scale=out.scale, **out.attrs())


def _constant_activation(ctx, node):
    found = _constant_source(ctx, node)
    if found is None or np.size(found[1]) != 1 or np.size(found[2]) != 1 or \
            found[0].dtype.name not in QUANTIZED:
        return None
    integers, scale, zero = found
    return Quantized(ir.const(integers), float(np.reshape(scale, ())),
                     ir.const(np.asarray(zero, np.int32).reshape(())))


def _global_average(ctx, y, out):
    if y.op != "nn.global_pool" or y.attrs["kind"] != "avg":
        return None
    source = activation(y.inputs[0])
    if source is None or source.zero_point is None:
        return None
    return _like(ctx, y, "qnn.global_avg_pool", [source.value], in_scale=source.scale,
                    in_zero=source.zero_point, out_scale=out.scale, **out.attrs())


def _concat(ctx, y, out):
    if y.op != "concatenate":
        return None
    parts = [integer_form(ctx, i, out) for i in y.inputs]
    if any(p is None for p in parts):
        return None
    return _like(ctx, y, "concatenate", parts, **y.attrs)


def _movement(ctx, y, out):
    """Data movement and max pooling commute with quantization (monotonic, per tensor): the
    same operator on the quantized input."""
    if y.op not in _MOVEMENT or (y.op in ("nn.pool2d", "nn.global_pool") and
                                 y.attrs["kind"] != "max"):
        return None
    inner = integer_form(ctx, y.inputs[0], out)
    if inner is None:
        return None
    if y.op == "reshape":
        return _reshaped(ctx, inner, y.shape)
    return _like(ctx, y, y.op, [inner], **y.attrs)


def _reshaped(ctx, x, shape):
    """``x`` in ``shape``, a reshape of a reshape as one (a packed dense layer's output keeps
    its data's leading dimensions, which a MatMul's float form flattens and restores)."""
    if x.op == "reshape":
        x = x.inputs[0]
    return reshape(ctx, x, shape)


# ------------------------------------------------------------------ QOperator


def _output(ctx, scale, zero, what) -> Output:
    if not scale.is_const or scale.size != 1 or zero is None or not zero.is_const or \
            zero.size != 1:
        raise Unsupported(f"{what}'s output scale and zero point must be constant scalars")
    dtype = zero.dtype
    return Output(float(scale.value.reshape(())), int(zero.value.reshape(())), dtype,
                  *qrange(dtype))


def _quantized_result(ctx, y, out: Output) -> list:
    """A QOperator's float form ``y`` quantized: as integer operators where it has that form,
    else dequantize, float operator, quantize (exact too)."""
    found = integer_form(ctx, y, out)
    if found is not None:
        return [found]
    return [ctx.make("qnn.quantize", [y, ir.const(np.float32(out.scale)),
                                      ir.const(np.asarray(out.zero, out.dtype))],
                     out_dtype=out.dtype)]


@converter("QLinearConv")
def _qlinear_conv(ctx, args, attrs):
    x, xs, xz, w, ws, wz, ys, yz = args[:8]
    bias = args[8] if len(args) > 8 else None
    source = _dequantized(ctx, x, xs, xz)
    weight = _dequantized(ctx, w, ws, wz, axis=0)
    float_bias = None if bias is None else _bias_dequantized(ctx, bias, xs, ws)
    (y,) = _float_converter(ctx, "Conv")(ctx, [source, weight, float_bias], attrs)
    return _quantized_result(ctx, y, _output(ctx, ys, yz, "QLinearConv"))


@converter("com.microsoft.QGemm")
def _qgemm(ctx, args, attrs):
    """onnxruntime's quantized Gemm: its int32 bias ``C`` in the units ``a_scale *
    b_scale``; without ``y_scale`` a float output."""
    if not 6 <= len(args) <= 9:
        raise ModelError(f"QGemm takes 6 to 9 inputs, the node has {len(args)}")
    a, a_s, a_z, b, b_s, b_z, c, y_s, y_z = list(args) + [None] * (9 - len(args))
    operands = [_dequantized(ctx, a, a_s, a_z),
                _dequantized(ctx, b, b_s, b_z, axis=0 if int(attrs.get("transB", 0)) else 1)]
    if c is not None:
        operands.append(_bias_dequantized(ctx, c, a_s, b_s))
    (y,) = _float_converter(ctx, "Gemm")(ctx, operands, attrs)
    if y_s is None:
        return [y]
    return _quantized_result(ctx, y, _output(ctx, y_s, _zero_like(a) if y_z is None else y_z,
                                             "QGemm"))


def _bias_dequantized(ctx, bias, xs, ws):
    """An int32 bias (QLinearConv's, QGemm's) in float, in the units ``x_scale * w_scale``."""
    product = ctx.constant(xs, "x_scale").astype(np.float32).reshape(-1) * \
        ctx.constant(ws, "w_scale").astype(np.float32).reshape(-1)
    return ir.const((ctx.constant(bias, "B").astype(np.float32) * product).astype(np.float32))


@converter("QLinearMatMul")
def _qlinear_matmul(ctx, args, attrs):
    a, a_s, a_z, b, b_s, b_z, y_s, y_z = args
    lhs = _dequantized(ctx, a, a_s, a_z)
    rhs = _dequantized(ctx, b, b_s, b_z, axis=-1)
    (y,) = _float_converter(ctx, "MatMul")(ctx, [lhs, rhs], attrs)
    return _quantized_result(ctx, y, _output(ctx, y_s, y_z, "QLinearMatMul"))


def _operands(ctx, args, count: int, what: str) -> list:
    """The inputs of one of onnxruntime's contrib operators (no ONNX schema checks them):
    ``count``, the last (an output zero point) optional and then None."""
    if len(args) not in (count - 1, count):
        raise ModelError(f"{what} takes {count - 1} or {count} inputs, the node has {len(args)}")
    return list(args) + [None] * (count - len(args))


@converter("com.microsoft.QLinearAdd", "com.microsoft.QLinearMul")
def _qlinear_binary(ctx, args, attrs):
    a, a_s, a_z, b, b_s, b_z, c_s, c_z = _operands(ctx, args, 8, ctx.op_type)
    op = "add" if ctx.op_type == "QLinearAdd" else "multiply"
    y = ctx.make(op, [_dequantized(ctx, a, a_s, a_z), _dequantized(ctx, b, b_s, b_z)])
    return _quantized_result(ctx, y, _output(ctx, c_s, _zero_like(a) if c_z is None else c_z,
                                             ctx.op_type))


def _zero_like(x):
    return ir.const(np.zeros((), x.dtype))


@converter("com.microsoft.QLinearGlobalAveragePool")
def _qlinear_global_average(ctx, args, attrs):
    x, xs, xz, ys, yz = _operands(ctx, args, 5, "QLinearGlobalAveragePool")
    if int(attrs.get("channels_last", 0)):
        raise Unsupported("channels_last=1 (NHWC) is not implemented")
    y = ctx.make("nn.global_pool", [_dequantized(ctx, x, xs, xz)], kind="avg")
    return _quantized_result(ctx, y, _output(ctx, ys, _zero_like(x) if yz is None else yz,
                                             "QLinearGlobalAveragePool"))


@converter("com.microsoft.QLinearConcat")
def _qlinear_concat(ctx, args, attrs):
    if len(args) < 5 or (len(args) - 2) % 3:
        raise ModelError(f"QLinearConcat takes Y_scale, Y_zero_point and triples of (tensor, "
                         f"scale, zero point), the node has {len(args)} inputs")
    ys, yz, rest = args[0], args[1], args[2:]
    parts = [_dequantized(ctx, *rest[k:k + 3]) for k in range(0, len(rest), 3)]
    (y,) = _float_converter(ctx, "Concat")(ctx, parts, attrs)
    return _quantized_result(ctx, y, _output(ctx, ys, yz, "QLinearConcat"))


def _accumulation(ctx, args, float_converter, attrs, weight_axis, rule):
    """ConvInteger, MatMulInteger: the int32 accumulation over the zero-point-centered
    operands (the zero points default to 0); an integer layer where the weight is a constant
    quantized per tensor or per output channel, else the float converter's operator over the
    centered operands in int32 (dequantized with scale 1, exact in float32)."""
    x, w = args[:2]
    xz = args[2] if len(args) > 2 else None
    wz = args[3] if len(args) > 3 else None
    if xz is not None and xz.size != 1:
        raise Unsupported(f"{ctx.op_type} with a per-row input zero point")
    source = _dequantized(ctx, x, ir.const(np.float32(1)), xz)
    wscale = ir.const(np.ones(wz.shape if wz is not None else (), np.float32))
    weight = _dequantized(ctx, w, wscale, wz, axis=weight_axis)
    (y,) = _float_converter(ctx, float_converter)(ctx, [source, weight], attrs)
    found = rule(ctx, y, None)
    if found is not None:
        return [found]
    centered = [ctx.make("cast", [node], dtype="int32") for node in (source, weight)]
    return _float_converter(ctx, float_converter)(ctx, centered, attrs)


@converter("ConvInteger")
def _conv_integer(ctx, args, attrs):
    return _accumulation(ctx, args, "Conv", attrs, 0, _conv)


@converter("MatMulInteger")
def _matmul_integer(ctx, args, attrs):
    return _accumulation(ctx, args, "MatMul", attrs, -1, _dense_any_rank)


def _dense_any_rank(ctx, y, out):
    """A MatMul's dense layer, through the reshape back to N-D data's rows."""
    if y.op == "reshape":
        inner = _dense(ctx, y.inputs[0], out)
        return None if inner is None else _reshaped(ctx, inner, y.shape)
    return _dense(ctx, y, out)


def _reduce_all(ctx, x, kind):
    """The minimum or maximum of every element: over the rows first, the columns in vectors
    (``qnn.column_reduce``), then over the columns (a serial reduction of the whole tensor
    would run on one core, element by element)."""
    if len(x.shape) > 1:
        x = ctx.make("qnn.column_reduce", [x], kind=kind)
    return ctx.make("reduce", [x], kind=kind, axes=(0,) if x.shape else (), keepdims=False)


@converter("DynamicQuantizeLinear")
def _dynamic_quantize(ctx, args, attrs):
    """onnxruntime's: the scale ``(max(x, 0) - min(x, 0)) / 255`` (1 where that is 0), the
    zero point ``round(-min(x, 0) / scale)``, uint8."""
    x = args[0]
    if x.dtype != "float32":
        raise Unsupported(f"DynamicQuantizeLinear of {x.dtype}")
    low, high = (_reduce_all(ctx, x, kind) for kind in ("min", "max"))
    scale = ctx.make("qnn.dynamic_scale", [low, high])
    zero = ctx.make("qnn.dynamic_zero", [low, scale])
    return [ctx.make("qnn.quantize", [x, scale, zero], out_dtype="uint8"), scale, zero]
