"""Quantized operators (TVM's ``qnn``): quantize, dequantize, requantize, integer convolution
and dense layers with their requantization in the output stage, quantized add, multiply and
global average pooling.

Rounding and saturation are onnxruntime's (MLAS): a value goes to an integer as
``clamp(nearbyint(v) + zero_point)`` in float32, round half to even; a convolution or dense
layer accumulates ``(x - x_zero_point) * w`` in int32 and requantizes
``float32(acc + bias) * (x_scale * w_scale / y_scale)``. Each operator's numpy form (its
``fold``) is the reference its kernels are checked against.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .elemwise import broadcast_index, broadcast_shape
from .nn import conv_window
from .registry import get, register, static_shape, unravel

#: the activation types of a quantized tensor
QUANTIZED = ("int8", "uint8")


def qrange(dtype: str) -> tuple[int, int]:
    if dtype not in QUANTIZED + ("int32",):
        raise ModelError(f"quantized type {dtype} is not supported (int8, uint8)")
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _f32(value) -> te.PrimExpr:
    return te.const(float(value), "float32")


def _i32(value) -> te.PrimExpr:
    return E.cast(value, "int32")


def to_integer(value, zero_point, lo: int, hi: int, dtype: str):
    """``clamp(nearbyint(value) + zero_point, lo, hi)`` as ``dtype``; ``value`` float32,
    ``zero_point`` a float32 expression or number."""
    v = te.nearbyint(value) + (zero_point if isinstance(zero_point, E.PrimExpr)
                               else _f32(zero_point))
    return E.cast(E.minimum(E.maximum(v, _f32(lo)), _f32(hi)), dtype)


def np_to_integer(value, zero_point, lo: int, hi: int, dtype: str) -> np.ndarray:
    v = np.rint(np.asarray(value, np.float32)) + np.asarray(zero_point, np.float32)
    return np.clip(v, lo, hi).astype(dtype)


def _scalar(tensor):
    return broadcast_index(tensor, ())


# ------------------------------------------------------------------ quantize, dequantize


def _per_axis_infer(inputs, out_dtype):
    x, scale, zero = inputs
    if broadcast_shape(x.shape, scale.shape, zero.shape) != tuple(x.shape):
        raise ModelError(f"scale {list(scale.shape)} and zero point {list(zero.shape)} do not "
                         f"broadcast to {list(x.shape)}")
    return x.shape, out_dtype


def _quantize(ts, attrs, node):
    x, scale, zero = ts
    lo, hi = qrange(node.dtype)
    return te.compute(node.shape, lambda *i: to_integer(
        x[i] / broadcast_index(scale, i), E.cast(broadcast_index(zero, i), "float32"),
        lo, hi, node.dtype), name="quantize")


def _quantize_fold(xs, attrs):
    x, scale, zero = xs
    return np_to_integer(x.astype(np.float32) / scale.astype(np.float32), zero, *qrange(attrs["out_dtype"]),
                         attrs["out_dtype"])


register("qnn.quantize", "broadcast",
         lambda inputs, attrs: _per_axis_infer(inputs, attrs["out_dtype"]), _quantize,
         _quantize_fold)


def _dequantize(ts, attrs, node):
    x, scale, zero = ts
    return te.compute(node.shape, lambda *i: E.cast(
        _i32(x[i]) - _i32(broadcast_index(zero, i)), "float32") * broadcast_index(scale, i),
        name="dequantize")


def _dequantize_fold(xs, attrs):
    x, scale, zero = xs
    return (x.astype(np.int32) - zero.astype(np.int32)).astype(np.float32) * \
        scale.astype(np.float32)


register("qnn.dequantize", "broadcast", lambda inputs, attrs: _per_axis_infer(inputs, "float32"),
         _dequantize, _dequantize_fold)


# ------------------------------------------------------------------ per-tensor elementwise


def _dequantized(v, scale: float, zero: int):
    return E.cast(_i32(v) - te.const(int(zero), "int32"), "float32") * _f32(scale)


def _np_dequantized(x, scale: float, zero: int):
    return (x.astype(np.int32) - np.int32(zero)).astype(np.float32) * np.float32(scale)


def _requantize(ts, attrs, node):
    """``quantize(dequantize(x))`` with other parameters (a tensor passed between layers of
    different scales), clamped to ``[out_min, out_max]`` (a fused ReLU or Clip)."""
    (x,) = ts
    return te.compute(node.shape, lambda *i: to_integer(
        _dequantized(x[i], attrs["in_scale"], attrs["in_zero"]) / _f32(attrs["out_scale"]),
        attrs["out_zero"], attrs["out_min"], attrs["out_max"], node.dtype), name="requantize")


def _requantize_fold(xs, attrs):
    v = _np_dequantized(xs[0], attrs["in_scale"], attrs["in_zero"]) / np.float32(attrs["out_scale"])
    return np_to_integer(v, attrs["out_zero"], attrs["out_min"], attrs["out_max"],
                         attrs["out_dtype"])


register("qnn.requantize", "elemwise", lambda inputs, attrs: (inputs[0].shape, attrs["out_dtype"]),
         _requantize, _requantize_fold)


def _binary_ratios(attrs):
    """The float32 factors onnxruntime's QLinearAdd and QLinearMul take."""
    a, b, c = (np.float32(attrs[k]) for k in ("a_scale", "b_scale", "out_scale"))
    return (a / c, b / c) if attrs["kind"] == "add" else (a * b / c,)


def _qbinary(ts, attrs, node):
    a, b = ts
    ratios = [_f32(r) for r in _binary_ratios(attrs)]

    def centered(t, i, key):
        return E.cast(_i32(broadcast_index(t, i)) - te.const(attrs[key], "int32"), "float32")

    def body(*i):
        ca, cb = centered(a, i, "a_zero"), centered(b, i, "b_zero")
        v = ca * ratios[0] + cb * ratios[1] if attrs["kind"] == "add" else ca * cb * ratios[0]
        return to_integer(v, attrs["out_zero"], attrs["out_min"], attrs["out_max"], node.dtype)
    return te.compute(node.shape, body, name=f"q{attrs['kind']}")


def _qbinary_fold(xs, attrs):
    ratios = _binary_ratios(attrs)
    ca = (xs[0].astype(np.int32) - attrs["a_zero"]).astype(np.float32)
    cb = (xs[1].astype(np.int32) - attrs["b_zero"]).astype(np.float32)
    v = ca * ratios[0] + cb * ratios[1] if attrs["kind"] == "add" else ca * cb * ratios[0]
    return np_to_integer(v, attrs["out_zero"], attrs["out_min"], attrs["out_max"],
                         attrs["out_dtype"])


register("qnn.binary", "broadcast",
         lambda inputs, attrs: (broadcast_shape(inputs[0].shape, inputs[1].shape),
                                attrs["out_dtype"]), _qbinary, _qbinary_fold)


# ------------------------------------------------------------------ requantized anchors


def requantized(acc, bias, multiplier, attrs, dtype):
    """The output stage's value: ``acc + bias`` (int32; or in float32, ``acc`` float32,
    where the caller knows the sum exact) scaled to the output's zero point and clamped to
    ``[out_min, out_max]`` (the output type's range, or a fused ReLU/Clip's)."""
    zero = attrs["out_zero"]
    if acc.dtype == "float32":
        v = (acc + E.cast(bias, "float32")) * multiplier
    else:
        v = E.cast(acc + bias, "float32") * multiplier
    v = E.minimum(E.maximum(v, _f32(attrs["out_min"] - zero)), _f32(attrs["out_max"] - zero))
    # clamped to integers then rounded: the same as rounded then clamped, and one
    # instruction where the target rounds to an integer in one (the code generator's lrint)
    return E.cast(_i32(te.nearbyint(v)) + te.const(zero, "int32"), dtype)


def np_requantized(acc, bias, multiplier, attrs, dtype):
    zero = attrs["out_zero"]
    v = np.rint((acc + bias).astype(np.float32) * multiplier.astype(np.float32))
    return (np.clip(v, attrs["out_min"] - zero, attrs["out_max"] - zero).astype(np.int32)
            + zero).astype(dtype)


def _check_requantize(inputs, attrs, channels: int, first: int):
    """The anchor's inputs past ``first``: none (int32 output, ConvInteger's and
    MatMulInteger's) or an int32 bias and a float32 multiplier per output channel."""
    extra = inputs[first:]
    if attrs["out_dtype"] == "int32":
        if extra:
            raise ModelError("an int32 output takes no bias or multiplier")
        return
    if len(extra) != 2 or extra[0].shape != (channels,) or extra[0].dtype != "int32" or \
            extra[1].shape != (channels,) or extra[1].dtype != "float32":
        raise ModelError(f"a requantized output needs an int32 bias and a float32 multiplier of "
                         f"{channels} entries")
    lo, hi = qrange(attrs["out_dtype"])
    if not lo <= attrs["out_min"] <= attrs["out_zero"] <= attrs["out_max"] <= hi:
        raise ModelError(f"output range [{attrs['out_min']}, {attrs['out_max']}] and zero point "
                         f"{attrs['out_zero']} do not fit {attrs['out_dtype']}")


def _check_integer_inputs(data, weight, zero):
    if data.dtype not in QUANTIZED or weight.dtype not in QUANTIZED + ("int16",) or \
            zero.dtype not in QUANTIZED + ("int32",) or zero.size != 1:
        raise ModelError(f"integer operands of {data.dtype} and {weight.dtype} with a zero "
                         f"point of {zero.dtype} {list(zero.shape)} are not supported")


def _output(acc, ts, attrs, node, channel_axis: int, tag: str):
    if attrs["out_dtype"] == "int32":
        return acc
    bias, multiplier = ts[3:5]
    in_float = acc.dtype == "float32" and bias_exact_in_float(node)
    return te.compute(node.shape, lambda *i: requantized(
        acc[i] if in_float else _i32(acc[i]), bias[i[channel_axis]],
        multiplier[i[channel_axis]], attrs, node.dtype), name=tag, tag=tag)


def _qconv2d_infer(inputs, attrs):
    data, weight, zero = inputs[:3]
    _check_integer_inputs(data, weight, zero)
    layout = attrs.get("kernel_layout", "OIHW")
    if layout not in ("OIHW", PACKED, PACKED_PIXELS, PACKED_WINDOW):
        raise ModelError(f"qnn.conv2d: unknown kernel_layout {attrs['kernel_layout']!r}")
    if layout == PACKED_PIXELS and not is_pixels_layer(attrs, inputs[1].shape[2:4]):
        raise ModelError("qnn.conv2d: the pixels form needs a 1x1 kernel, stride 1 and no "
                         "padding")
    if layout in (PACKED, PACKED_PIXELS, PACKED_WINDOW):
        if len(inputs) != 5 or len(weight.shape) != 6 or attrs["groups"] != 1:
            raise ModelError("qnn.conv2d: a packed weight needs groups=1, a bias and a "
                             "multiplier")
        channels = inputs[3].shape[0]
        blocks, quads, kh, kw = weight.shape[:4]
        reduction = data.shape[1]
        if layout == PACKED_WINDOW:
            window = attrs.get("window")
            if not (isinstance(window, (tuple, list)) and len(window) == 2 and
                    all(isinstance(v, int) and 1 <= v <= 64 for v in window)) or \
                    (kh, kw) != (1, 1):
                raise ModelError(f"qnn.conv2d: the window form needs a window of two sizes "
                                 f"1..64 and a pointwise packed weight, got window {window!r}, "
                                 f"weight {list(weight.shape)}")
            kh, kw = window
            reduction *= kh * kw
        if blocks != -(-channels // BLOCK_O) or quads != -(-reduction // BLOCK_I) + 1:
            window = f" and a {kh}x{kw} window" if layout == PACKED_WINDOW else ""
            raise ModelError(f"qnn.conv2d: packed weight {list(weight.shape)} does not match "
                             f"{channels} output and {data.shape[1]} input channels{window}")
        weight = SimpleNamespace(shape=(channels, data.shape[1], kh, kw))     # as OIHW
    shape, _ = get("nn.conv2d").infer([data, weight], attrs)
    _check_requantize(inputs, attrs, shape[1], 3)
    return shape, attrs["out_dtype"]


#: float32's integers are exact up to this magnitude
FLOAT_EXACT = 2 ** 24


def sums_exact_in_float(node) -> bool:
    """Whether every partial sum of a plain (OIHW) layer's products is an integer of magnitude
    below :data:`FLOAT_EXACT`, so that float32 computes them exactly, whatever their order:
    a requantized output, a constant weight and a zero point whose centered input stays
    within 255 (a constant one, or one of the input's type), and for each output the sum of
    its weights' magnitudes times that reach below the bound. A layer whose ``accumulate``
    attribute records the answer (:func:`value_facts`) takes it from there."""
    if "accumulate" in node.attrs:
        return node.attrs["accumulate"] == "float32"
    weight, zero = node.inputs[1].value, node.inputs[2]
    if weight is None or node.attrs["out_dtype"] == "int32":
        return False
    lo, hi = qrange(node.inputs[0].dtype)
    if zero.value is not None:
        z = int(np.asarray(zero.value).reshape(()))
        reach = max(abs(lo - z), abs(hi - z))
    elif zero.dtype in QUANTIZED:
        reach = 255
    else:
        return False
    return _float_reach(node, reach) < FLOAT_EXACT


def _float_reach(node, reach: int) -> int:
    """The largest magnitude a plain layer's sum of products can take: the sum of an
    output's weights' magnitudes times the centered input's ``reach``."""
    weight = node.inputs[1].value
    magnitudes = np.abs(weight.astype(np.int64)).reshape(len(weight), -1).sum(axis=1)
    return int(magnitudes.max(initial=0)) * reach


def bias_exact_in_float(node) -> bool:
    """Whether a layer whose sums are exact in float32 (:func:`sums_exact_in_float`) also
    adds its constant bias exactly in float32: every ``sum + bias`` below
    :data:`FLOAT_EXACT` in magnitude (then the output stage adds in float, without a
    conversion to int32 and back). Its ``bias_in_float`` attribute, where recorded, is the
    answer."""
    if "bias_in_float" in node.attrs:
        return bool(node.attrs["bias_in_float"])
    bias = node.inputs[3].value if len(node.inputs) > 3 else None
    if bias is None or not sums_exact_in_float(node):
        return False
    return _float_reach(node, 255) + int(np.abs(bias.astype(np.int64)).max(initial=0)) < \
        FLOAT_EXACT


def value_facts(node) -> dict:
    """What an integer layer's computation takes from its constants' values, as attributes
    (``accumulate``: the sums' type, ``bias_in_float``): a layer that has them computes the
    same whatever its operands are (a tuning task's layer, whose operands are arguments)."""
    return {"accumulate": "float32" if sums_exact_in_float(node) else "int32",
            "bias_in_float": bias_exact_in_float(node)}


def sample_operands(node, seed: int = 0) -> list:
    """Operands of an integer layer (``qnn.conv2d``, ``qnn.dense``) that its computation, as
    :func:`value_facts` recorded it, takes exactly, seeded: data over its type's range, a
    zero point inside it, weights of magnitude 7 at most (fewer where a long reduction
    accumulated in float32 needs it to stay exact), packed with their sums as the importer
    packs them, a small bias (a packed convolution's folded with the zero point's share, as
    the importer folds it) and multipliers that spread the outputs over their range."""
    rng = np.random.default_rng(seed)
    data, weight, zero, *rest = node.inputs
    layout = node.attrs.get("kernel_layout")
    lo, hi = qrange(data.dtype)
    depth = data.shape[1] if node.op == "qnn.conv2d" else data.shape[-1]
    if layout == PACKED_WINDOW:
        depth *= math.prod(node.attrs["window"])
    elif node.op == "qnn.conv2d" and layout not in (PACKED, PACKED_PIXELS):
        depth = math.prod(weight.shape[1:])
    reduction = depth * (math.prod(weight.shape[2:4]) if layout == PACKED else 1)
    bound = max(1, min(7, (FLOAT_EXACT - 1 - 1000) // (reduction * 255)))
    wlo, whi = (0, bound) if weight.dtype == "uint8" else (-bound, bound)

    def weights(shape):
        return rng.integers(wlo, whi + 1, shape).astype(weight.dtype)
    zero_point = int(rng.integers(lo, hi + 1))
    bias = rng.integers(-1000, 1001, rest[-2].shape[0]) if len(rest) >= 2 else None
    extra = []
    if layout in (PACKED, PACKED_PIXELS, PACKED_WINDOW):
        oihw = weights((rest[0].shape[0], depth, *weight.shape[2:4]))
        w = pack_weight(oihw)
        bias = packed_bias(bias, oihw, data.dtype, zero_point)
    elif layout == PACKED_DENSE:
        plain = weights((depth, rest[0].shape[0]))
        w = pack_dense_weight(plain)
        extra.append(plain.astype(np.int64).sum(axis=0).astype(rest[0].dtype))
    else:
        w = weights(weight.shape)
    operands = [rng.integers(lo, hi + 1, data.shape).astype(data.dtype), w,
                np.full(zero.shape, zero_point, zero.dtype), *extra]
    if bias is not None:
        spread = rng.uniform(0.5, 2.0, len(bias)) / (8.0 * math.sqrt(reduction))
        operands += [bias.astype(rest[-2].dtype), spread.astype(rest[-1].dtype)]
    return operands


def _qconv2d(ts, attrs, node):
    """``acc[n, o, y, x] = sum (x - x_zero) * w`` over the window, the input centered
    (``qcenter``) and zero-padded (``pad``: its padding is the zero point; a strided layer's
    split into its phases, :func:`~.nn.conv_window`, which a stage holds in consecutive
    vectors), then the requantizing output stage. The sums are int32, or float32 where they
    are exact in it (:func:`sums_exact_in_float`: a depthwise layer's 9 products always
    are), which the targets multiply and add in one instruction and in vectors of the float
    layers' width."""
    if attrs.get("kernel_layout") == PACKED:
        return _qconv2d_packed(ts, attrs, node)
    if attrs.get("kernel_layout") == PACKED_PIXELS:
        return _qconv2d_pixels(ts, attrs, node)
    if attrs.get("kernel_layout") == PACKED_WINDOW:
        return _qconv2d_window(ts, attrs, node)
    data, weight, zero = ts[:3]
    _, channels, height, width = static_shape(data)
    _, cg, kh, kw = static_shape(weight)
    ocg = node.shape[1] // attrs["groups"]
    x_zero = _i32(_scalar(zero))
    dtype = "float32" if sums_exact_in_float(node) else "int32"

    centered = te.compute(data.shape, lambda *i: E.cast(_i32(data[i]) - x_zero, dtype),
                          name="qcenter", tag="qcenter")

    rc, ry, rx = (te.reduce_axis((0, e), name) for e, name in ((cg, "rc"), (kh, "ry"),
                                                              (kw, "rx")))

    def padded(before, after):       # a stage even where nothing is padded
        (pt, pl), (pb, pr) = before, after

        def padding(n, c, y, x):
            inside = te.all(y >= pt, y < height + pt, x >= pl, x < width + pl)
            return E.if_then_else(inside, centered[n, c, y - pt, x - pl], te.const(0, dtype))
        return te.compute((node.shape[0], channels, height + pt + pb, width + pl + pr),
                          padding, name="qpad", tag="pad")
    window = conv_window(centered, attrs, ry, rx, padded, name="qpad")

    def channel(o):
        return rc if attrs["groups"] == 1 else E.floordiv(o, ocg) * cg + rc
    acc = te.compute(node.shape, lambda n, o, y, x: te.sum(
        window(n, channel(o), y, x) * E.cast(weight[o, rc, ry, rx], dtype),
        axis=[rc, ry, rx]), name="qconv2d_acc", tag="qconv2d")
    return _output(acc, ts, attrs, node, 1, "qconv2d")


def np_qconv2d(xs, attrs):
    from .reference import conv2d_reference

    data, weight, zero = xs[:3]
    pt, pl, pb, pr = attrs["padding"]
    zero = int(np.asarray(zero).reshape(()))
    layout = attrs.get("kernel_layout")
    if layout in (PACKED, PACKED_PIXELS, PACKED_WINDOW):   # raw quads padded with its zero
        if layout == PACKED_WINDOW:
            kh, kw = attrs["window"]
            weight = unpack_weight(weight, xs[3].size, data.shape[1] * kh * kw).reshape(
                xs[3].size, data.shape[1], kh, kw)
        else:
            weight = unpack_weight(weight, xs[3].size, data.shape[1])
        shift = 128 if data.dtype == np.int8 else 0
        raw = data.astype(np.int64) + shift
        padded = np.pad(raw, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=zero + shift)
    else:
        padded = np.pad(data.astype(np.int64) - zero, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    acc = conv2d_reference(padded.astype(np.float64), weight.astype(np.float64),
                           strides=attrs["strides"], padding=(0, 0, 0, 0),
                           dilation=attrs["dilation"], groups=attrs["groups"])
    acc = np.rint(acc).astype(np.int32)
    if attrs["out_dtype"] == "int32":
        return acc
    return np_requantized(acc, xs[3].reshape(1, -1, 1, 1), xs[4].reshape(1, -1, 1, 1), attrs,
                          attrs["out_dtype"])


# ------------------------------------------------------------------ the packed convolution

#: the packed weight's blocks (``kernel_layout`` :data:`PACKED`,
#: ``[O/16][I/4 + 1][KH][KW][16][4]``): 16 output channels, one vector of int32 accumulators,
#: by 4 input channels, the bytes x86's ``vpdpbusd``/``vpmaddubsw`` and Arm's ``sdot`` sum
#: into each accumulator; a block's last quad holds its weight sums (:func:`weight_sums`)
BLOCK_O, BLOCK_I = 16, 4
PACKED = "OIHW16o4i"
#: the same weight read by the ``pixels`` form of a pointwise layer (:func:`_qconv2d_pixels`)
PACKED_PIXELS = "OIHW16o4i_pixels"
#: the ``pixels`` form of a layer of few input channels with a window
#: (:func:`_qconv2d_window`): its weight packed as a pointwise one's over the reduction's
#: (channel, row, column) triples, ``attrs["window"]`` the kernel's height and width
PACKED_WINDOW = "OIHW16o4i_window"


def is_pixels_layer(attrs, kernel, pixels: int | None = None) -> bool:
    """A layer the ``pixels`` form computes: a 1x1 kernel, stride 1, no padding, one group
    (and, given its output's ``pixels``, whole vectors of 16 of them)."""
    return tuple(kernel) == (1, 1) and tuple(attrs["strides"]) == (1, 1) and \
        not any(attrs["padding"]) and attrs["groups"] == 1 and \
        (pixels is None or pixels % BLOCK_O == 0)


#: the most (channel, row, column) triples of a window form's reduction: its staged quads
#: take ``triples / 4`` times the output's pixels in bytes
WINDOW_TRIPLES = 32


def is_window_layer(attrs, kernel, channels: int, pixels: int,
                    triples: int = WINDOW_TRIPLES) -> bool:
    """A layer the ``pixels`` form computes over its window's taps (:data:`PACKED_WINDOW`):
    one group, a kernel larger than 1x1, input channels that fill at most one quad (a
    network's first layer: 3 channels, where the packed form's quads are a quarter padding
    and its tile's reduction a few steps) and at most ``triples`` taps in all, output pixels
    in whole vectors of 16. Which layers take it is the target's (the build's choice,
    :func:`kernelrpc.relay.tuning.int8_forms`, ``triples`` from
    :func:`kernelrpc.relay.strategy.int8.window_triples`)."""
    return attrs["groups"] == 1 and tuple(kernel) != (1, 1) and channels <= BLOCK_I and \
        channels * math.prod(kernel) <= triples and pixels % BLOCK_O == 0


def window_weight(weight: np.ndarray) -> np.ndarray:
    """An OIHW weight as the window form's pointwise one, ``[O][C*KH*KW][1][1]``."""
    return weight.reshape(weight.shape[0], -1, 1, 1)


def pack_weight(weight: np.ndarray) -> np.ndarray:
    """An OIHW int8 weight as ``[O/16][I/4 + 1][KH][KW][16][4]``, zeros past its channels,
    each block's sums in its last quad."""
    o, i, kh, kw = weight.shape
    blocks, quads = -(-o // BLOCK_O), -(-i // BLOCK_I)
    full = np.zeros((blocks * BLOCK_O, quads * BLOCK_I, kh, kw), weight.dtype)
    full[:o, :i] = weight
    packed = np.zeros((blocks, quads + 1, kh, kw, BLOCK_O, BLOCK_I), weight.dtype)
    packed[:, :quads] = full.reshape(blocks, BLOCK_O, quads, BLOCK_I, kh, kw).transpose(
        0, 2, 4, 5, 1, 3)
    packed[:, quads, 0, 0] = _sums_bytes(full.astype(np.int64).sum(axis=(1, 2, 3)))
    return packed


def _sums_bytes(sums: np.ndarray) -> np.ndarray:
    """Each block's 16 sums as the 16 x 4 bytes of little-endian int32."""
    if np.abs(sums).max(initial=0) >= 2 ** 31:
        raise ModelError("the weight sums of a packed int8 layer overflow int32")
    return sums.astype("<i4").view(np.int8).reshape(-1, BLOCK_O, BLOCK_I)


def weight_sums(packed: np.ndarray) -> np.ndarray:
    """The per-output sums of a packed weight's values (``[O/16][16]`` int32), kept in each
    block's last quad for kernels that take the input shifted by 128 (aarch64's ``sdot``
    multiplies int8 by int8: ``sum x * w = sum (x - 128) * w + 128 * sum w``)."""
    sums = packed[:, -1, 0, 0] if packed.ndim == 6 else packed[:, -1]
    return np.ascontiguousarray(sums).view("<i4").reshape(len(packed), BLOCK_O).astype(np.int32)


def packed_quads(packed: np.ndarray) -> np.ndarray:
    """A packed weight's quads of values, without its sums."""
    return packed[:, :-1]


def unpack_weight(packed: np.ndarray, out_channels: int, in_channels: int) -> np.ndarray:
    packed = packed_quads(packed)
    blocks, quads, kh, kw = packed.shape[:4]
    full = packed.transpose(0, 4, 1, 5, 2, 3).reshape(blocks * BLOCK_O, quads * BLOCK_I, kh, kw)
    return full[:out_channels, :in_channels]


def packed_bias(bias: np.ndarray, weight: np.ndarray, data_dtype: str, zero: int) -> np.ndarray:
    """The bias of the packed form, which accumulates the raw quads (uint8, int8 data shifted
    by 128): ``sum (x - zero) * w = sum x' * w - zero' * sum w``, the last term folded here."""
    shifted = zero + (128 if data_dtype == "int8" else 0)
    folded = bias.astype(np.int64) - shifted * weight.astype(np.int64).sum(axis=(1, 2, 3))
    if np.abs(folded).max(initial=0) >= 2 ** 31:
        raise ModelError("the folded bias of a packed int8 convolution overflows int32")
    return folded.astype(np.int32)


def _shift(data) -> int:
    """What the packed forms add to their input's bytes: int8 data moves by 128 into uint8
    (the quad instructions' unsigned operand), uint8 stays as it is."""
    return 128 if data.dtype == "int8" else 0


def _raw(value, shift: int):
    """An input byte (or the zero point that pads the input) as the packed forms read it."""
    return E.cast(_i32(value) + te.const(shift, "int32"), "uint8")


def _qconv2d_packed(ts, attrs, node):
    """The packed form: the input as quads of channels (``[n][C/4][h][w][4]`` uint8, padded
    with its zero point), ``acc[n][O/16][y][x][16] = sum x' * w`` over the quads, the window
    and each quad's 4 bytes, then the requantizing output stage (the zero point's share is in
    the bias, :func:`packed_bias`)."""
    data, weight, zero, bias, multiplier = ts
    _, channels, height, width = static_shape(data)
    blocks, quads, kh, kw = static_shape(weight)[:4]
    quads -= 1                                    # the last holds the sums
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = attrs["strides"], attrs["dilation"], attrs["padding"]
    shift = _shift(data)

    def quad(n, c4, y, x, i):
        c = c4 * BLOCK_I + i
        inside = te.all(y >= pt, y < height + pt, x >= pl, x < width + pl, c < channels)
        raw = _raw(data[n, E.minimum(c, channels - 1), y - pt, x - pl], shift)
        return E.if_then_else(inside, raw, _raw(_scalar(zero), shift))
    padded = te.compute((node.shape[0], quads, height + pt + pb, width + pl + pr, BLOCK_I), quad,
                        name="qquads", tag="pad")
    rc, ry, rx, ri = (te.reduce_axis((0, e), name) for e, name in (
        (quads, "rc"), (kh, "ry"), (kw, "rx"), (BLOCK_I, "ri")))
    _, _, oh, ow = node.shape
    acc = te.compute((node.shape[0], blocks, oh, ow, BLOCK_O), lambda n, ob, y, x, v: te.sum(
        _i32(padded[n, rc, y * sh + ry * dh, x * sw + rx * dw, ri]) *
        _i32(weight[ob, rc, ry, rx, v, ri]), axis=[rc, ry, rx, ri]),
        name="qconv2d_blocked", tag="qconv2d")
    return te.compute(node.shape, lambda n, o, y, x: requantized(
        acc[n, E.floordiv(o, BLOCK_O), y, x, E.floormod(o, BLOCK_O)], bias[o], multiplier[o],
        attrs, node.dtype), name="qconv2d", tag="qconv2d")


def _qconv2d_pixels(ts, attrs, node):
    """The ``pixels`` form of a pointwise layer: the input's quads of channels over its
    flattened pixels (``[n][C/4][H*W][4]`` uint8), ``acc[n][O][H*W/16][16] = sum x' * w``
    over the quads and each quad's 4 bytes, as a matrix product whose vectors run along a channel's
    pixels, then the requantizing output stage on those vectors: a channel's pixels are one
    contiguous run of the NCHW output, so the tile is written back as it is (the packed form's
    tile holds 16 channels of a pixel, which the output reads back by columns)."""
    data, weight, zero = ts[:3]
    n_, channels, height, width = static_shape(data)
    quads = static_shape(weight)[1] - 1           # the last holds the sums
    shift = _shift(data)

    def quad(n, c4, p, i):
        c = c4 * BLOCK_I + i
        raw = _raw(data[n, E.minimum(c, channels - 1), E.floordiv(p, width),
                        E.floormod(p, width)], shift)
        return E.if_then_else(c < channels, raw, _raw(_scalar(zero), shift))
    padded = te.compute((n_, quads, height * width, BLOCK_I), quad, name="qquads", tag="pad")
    return _pixels_product(padded, ts, attrs, node)


def _pixels_product(padded, ts, attrs, node):
    """``acc[n][O][P/16][16] = sum x' * w`` over the quads of ``padded`` (``[n][Q][P][4]``,
    ``P`` the output's pixels) and each quad's 4 bytes, then the requantizing output stage on
    those vectors."""
    weight, bias, multiplier = ts[1], ts[3], ts[4]
    n_, quads, pixels, _ = static_shape(padded)
    width = node.shape[3]
    rc, ri = te.reduce_axis((0, quads), "rc"), te.reduce_axis((0, BLOCK_I), "ri")
    acc = te.compute((n_, node.shape[1], pixels // BLOCK_O, BLOCK_O),
                     lambda n, o, pb, v: te.sum(
        _i32(padded[n, rc, pb * BLOCK_O + v, ri]) *
        _i32(weight[E.floordiv(o, BLOCK_O), rc, 0, 0, E.floormod(o, BLOCK_O), ri]),
        axis=[rc, ri]), name="qconv2d_pixels", tag="qconv2d")

    def output(n, o, y, x):
        p = y * width + x
        return requantized(acc[n, o, E.floordiv(p, BLOCK_O), E.floormod(p, BLOCK_O)], bias[o],
                           multiplier[o], attrs, node.dtype)
    return te.compute(node.shape, output, name="qconv2d", tag="qconv2d")


def _qconv2d_window(ts, attrs, node):
    """The ``pixels`` form over a window (:data:`PACKED_WINDOW`): the quads run over the
    reduction's (channel, row, column) triples, each pixel's quad the 4 taps' input bytes
    (the zero point outside the map and past the last triple), so that a layer of 3 input
    channels and a 3x3 window is a pointwise layer of 27 (7 quads, where the packed form
    fills 1 quad of 4 channels per tap); then the pixels form's product and output stage."""
    data, weight, zero = ts[:3]
    n_, channels, height, width = static_shape(data)
    kh, kw = attrs["window"]
    (sh, sw), (dh, dw), (pt, pl, _, _) = attrs["strides"], attrs["dilation"], attrs["padding"]
    _, _, _, out_width = node.shape
    reduction = channels * kh * kw
    shift = _shift(data)

    def tap(n, q, p, i):
        k = q * BLOCK_I + i
        c, ry, rx = E.floordiv(k, kh * kw), E.floormod(E.floordiv(k, kw), kh), E.floormod(k, kw)
        y = E.floordiv(p, out_width) * sh + ry * dh - pt
        x = E.floormod(p, out_width) * sw + rx * dw - pl
        inside = te.all(k < reduction, y >= 0, y < height, x >= 0, x < width)
        raw = _raw(data[n, E.minimum(c, channels - 1), y, x], shift)
        return E.if_then_else(inside, raw, _raw(_scalar(zero), shift))
    quads = static_shape(weight)[1] - 1
    padded = te.compute((n_, quads, node.shape[2] * out_width, BLOCK_I), tap, name="qquads",
                        tag="pad")
    return _pixels_product(padded, ts, attrs, node)


register("qnn.conv2d", "anchor", _qconv2d_infer, _qconv2d, np_qconv2d,
         flops=lambda node: 2 * node.size * node.inputs[0].shape[1] // node.attrs["groups"] *
         math.prod(node.attrs.get("window") or node.inputs[1].shape[2:4]))


def _qdense_infer(inputs, attrs):
    data, weight, zero = inputs[:3]
    _check_integer_inputs(data, weight, zero)
    layout = attrs.get("kernel_layout", "KN")
    if layout not in ("KN", PACKED_DENSE):
        raise ModelError(f"qnn.dense: unknown kernel_layout {layout!r}")
    if layout == PACKED_DENSE:
        wsum = inputs[3]
        columns = wsum.shape[0] if len(wsum.shape) == 1 else -1
        if len(weight.shape) != 4 or weight.shape[0] != -(-columns // BLOCK_O) or \
                len(data.shape) < 2 or weight.shape[1] != -(-data.shape[-1] // BLOCK_I) + 1:
            raise ModelError(f"qnn.dense: packed weight {list(weight.shape)} and column sums "
                             f"{list(wsum.shape)} do not match data {list(data.shape)}")
        _check_requantize(inputs, attrs, columns, 4)
        return (*data.shape[:-1], columns), attrs["out_dtype"]
    shape, _ = get("nn.dense").infer(inputs[:2], {})
    _check_requantize(inputs, attrs, shape[1], 3)
    return shape, attrs["out_dtype"]


def _qdense(ts, attrs, node):
    if attrs.get("kernel_layout") == PACKED_DENSE:
        return _qdense_packed(ts, attrs, node)
    data, weight, zero = ts[:3]
    x_zero = _i32(_scalar(zero))
    k = te.reduce_axis((0, static_shape(data)[1]), "k")
    acc = te.compute(node.shape, lambda i, j: te.sum(
        (_i32(data[i, k]) - x_zero) * _i32(weight[k, j]), axis=k), name="qdense_acc",
        tag="qdense")
    return _output(acc, ts, attrs, node, 1, "qdense")


def np_qdense(xs, attrs):
    data, weight, zero = xs[:3]
    rest = xs[3:]
    if attrs.get("kernel_layout") == PACKED_DENSE:
        weight, rest = unpack_dense_weight(weight, data.shape[-1], xs[3].size), xs[4:]
    centered = data.astype(np.int64) - int(np.asarray(zero).reshape(()))
    acc = (centered @ weight.astype(np.int64)).astype(np.int32)
    if attrs["out_dtype"] == "int32":
        return acc
    return np_requantized(acc, rest[0], rest[1], attrs, attrs["out_dtype"])


#: the packed dense weight, ``[N/16][K/4 + 1][16][4]`` (16 outputs by a quad of the
#: reduction; the last quad holds each output's weight sum, :func:`weight_sums`)
PACKED_DENSE = "NK16n4k"


def pack_dense_weight(weight: np.ndarray) -> np.ndarray:
    """A ``[K][N]`` int8 weight as ``[N/16][K/4 + 1][16][4]``, zeros past its extents, the
    sums in each block's last quad."""
    k, n = weight.shape
    blocks, quads = -(-n // BLOCK_O), -(-k // BLOCK_I)
    full = np.zeros((blocks * BLOCK_O, quads * BLOCK_I), weight.dtype)
    full[:n, :k] = weight.T
    packed = np.zeros((blocks, quads + 1, BLOCK_O, BLOCK_I), weight.dtype)
    packed[:, :quads] = full.reshape(blocks, BLOCK_O, quads, BLOCK_I).transpose(0, 2, 1, 3)
    packed[:, quads] = _sums_bytes(full.astype(np.int64).sum(axis=1))
    return packed


def unpack_dense_weight(packed: np.ndarray, depth: int, columns: int) -> np.ndarray:
    packed = packed_quads(packed)
    blocks, quads = packed.shape[:2]
    full = packed.transpose(0, 2, 1, 3).reshape(blocks * BLOCK_O, quads * BLOCK_I)
    return np.ascontiguousarray(full[:columns, :depth].T)


def _qdense_packed(ts, attrs, node):
    """The packed form: each row's quads of the reduction (uint8, int8 data shifted by 128,
    zeros past its end; N-D data's leading dimensions are the rows, and the output's), ``acc[i][N/16][16] = sum x' * w``, then the output stage subtracts
    the zero point's share, ``(zero + shift) * sum_k w[k, j]`` (the column sums, an input:
    the zero point may be computed at run time), and requantizes."""
    data, weight, zero, wsum = ts[:4]
    *lead, depth = static_shape(data)
    blocks, quads = static_shape(weight)[:2]
    quads -= 1                                    # the last holds the sums
    shift = _shift(data)

    def element(i, c):             # flat row ``i`` of N-D data, its leading dimensions taken apart
        raw = _raw(data[(*unravel(i, lead), E.minimum(c, depth - 1))], shift)
        return E.if_then_else(c < depth, raw, te.const(0, "uint8"))
    rows = math.prod(lead)
    padded = te.compute((rows, quads * BLOCK_I), element, name="qrows", tag="pad")
    rq, ri = te.reduce_axis((0, quads), "rq"), te.reduce_axis((0, BLOCK_I), "ri")
    acc = te.compute((rows, blocks, BLOCK_O), lambda i, b, v: te.sum(
        _i32(padded[i, rq * BLOCK_I + ri]) * _i32(weight[b, rq, v, ri]), axis=[rq, ri]),
        name="qdense_blocked", tag="qdense")
    share = _i32(_scalar(zero)) + te.const(shift, "int32")

    def centered(*index):
        i, j = index[0], index[-1]
        for axis, extent in zip(index[1:-1], lead[1:]):
            i = i * extent + axis
        return acc[i, E.floordiv(j, BLOCK_O), E.floormod(j, BLOCK_O)] - share * wsum[j]
    if attrs["out_dtype"] == "int32":
        return te.compute(node.shape, centered, name="qdense", tag="qdense")
    bias, multiplier = ts[4:6]
    return te.compute(node.shape, lambda *index: requantized(
        centered(*index), bias[index[-1]], multiplier[index[-1]], attrs, node.dtype),
        name="qdense", tag="qdense")


register("qnn.dense", "anchor", _qdense_infer, _qdense, np_qdense,
         flops=lambda node: 2 * node.size * node.inputs[0].shape[-1])


def _avg_pool_scale(attrs, count: int) -> np.float32:
    """onnxruntime's QLinearGlobalAveragePool factor, ``x_scale / (y_scale * count)``."""
    return np.float32(attrs["in_scale"]) / (np.float32(attrs["out_scale"]) * np.float32(count))


def _qglobal_avg_pool(ts, attrs, node):
    (x,) = ts
    dims = static_shape(x)
    axes = [te.reduce_axis((0, d), f"r{k}") for k, d in enumerate(dims[2:])]
    total = te.compute(node.shape, lambda *i: te.sum(_i32(x[(i[0], i[1], *axes)]), axis=axes),
                       name="qglobal_avg_pool_sum", tag="reduce")
    count = math.prod(dims[2:])
    bias = te.const(-attrs["in_zero"] * count, "int32")
    scale = _f32(_avg_pool_scale(attrs, count))
    return te.compute(node.shape, lambda *i: requantized(total[i], bias, scale, attrs, node.dtype),
                      name="qglobal_avg_pool")


def _qglobal_avg_pool_fold(xs, attrs):
    x = xs[0]
    count = math.prod(x.shape[2:])
    total = x.astype(np.int32).sum(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.int32)
    return np_requantized(total, np.int32(-attrs["in_zero"] * count),
                          _avg_pool_scale(attrs, count), attrs, attrs["out_dtype"])


register("qnn.global_avg_pool", "anchor",
         lambda inputs, attrs: (get("nn.global_pool").infer(inputs, attrs)[0], attrs["out_dtype"]),
         _qglobal_avg_pool, _qglobal_avg_pool_fold,
         flops=lambda node: node.inputs[0].size)


# ------------------------------------------------------------------ dynamic quantization


def _column_reduce(ts, attrs, node):
    """The minimum or maximum of each column (the last axis) over every other axis."""
    (x,) = ts
    dims = static_shape(x)
    axes = [te.reduce_axis((0, d), f"r{k}") for k, d in enumerate(dims[:-1])]
    reducer = te.min if attrs["kind"] == "min" else te.max
    return te.compute(node.shape, lambda c: reducer(x[(*axes, c)], axis=axes),
                      name=f"column_{attrs['kind']}", tag="column_reduce")


def _column_reduce_infer(inputs, attrs):
    x = inputs[0]
    if len(x.shape) < 2 or attrs["kind"] not in ("min", "max"):
        raise ModelError(f"column reduction ({attrs['kind']}) of {list(x.shape)}")
    return (x.shape[-1],), x.dtype


register("qnn.column_reduce", "anchor", _column_reduce_infer, _column_reduce,
         lambda xs, a: (np.min if a["kind"] == "min" else np.max)(
             xs[0].reshape(-1, xs[0].shape[-1]), axis=0),
         flops=lambda node: node.inputs[0].size)


def _dynamic_scale(ts, attrs, node):
    """DynamicQuantizeLinear's scale from the tensor's minimum and maximum (each widened to
    hold 0): their span over 255, or 1 where the span is 0 (onnxruntime's)."""
    low, high = ts
    span = E.maximum(_scalar(high), _f32(0)) - E.minimum(_scalar(low), _f32(0))
    return te.compute(node.shape, lambda *i: E.if_then_else(
        span == _f32(0), _f32(1), span / _f32(255)), name="dynamic_scale")


def _np_dynamic_scale(xs, attrs):
    span = np.float32(max(float(xs[1]), 0.0)) - np.float32(min(float(xs[0]), 0.0))
    return np.asarray(1 if span == 0 else span / np.float32(255), np.float32)


register("qnn.dynamic_scale", "broadcast", lambda inputs, attrs: ((), "float32"),
         _dynamic_scale, _np_dynamic_scale)


def _dynamic_zero(ts, attrs, node):
    """DynamicQuantizeLinear's zero point, ``round(clamp(-min / scale, 0, 255))``, halves away
    from zero (std::round)."""
    low, scale = ts
    v = E.minimum(E.maximum(_f32(0) - E.minimum(_scalar(low), _f32(0)) / _scalar(scale),
                            _f32(0)), _f32(255))
    return te.compute(node.shape, lambda *i: E.cast(te.floor(v + _f32(0.5)), "uint8"),
                      name="dynamic_zero")


def _np_dynamic_zero(xs, attrs):
    low, scale = (np.float32(v) for v in xs)
    v = np.clip(np.float32(0) - np.float32(min(low, 0)) / scale, 0, 255)
    return np.asarray(np.floor(v + np.float32(0.5)), np.uint8)


register("qnn.dynamic_zero", "broadcast", lambda inputs, attrs: ((), "uint8"), _dynamic_zero,
         _np_dynamic_zero)
