"""ONNX converters of the network layers: Conv, ConvTranspose, Gemm, MatMul, Softmax,
BatchNormalization, pooling, LRN. Convolutions and poolings of 1, 2 and 3 spatial dimensions
are the 2-D operators' (1-D over a unit height, 3-D with the depth folded in), so that one
set of schedules serves the three."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import ir
from ..errors import ModelError
from .onnx_common import Unsupported, converter, normalize_axis, reshape

#: the largest depth-unfolded input of a 3-D convolution (its depth taps side by side as the
#: channels of a 2-D one), in bytes
MAX_UNFOLDED_BYTES = 1 << 30


@dataclass(frozen=True)
class Window:
    """A convolution's or a pooling's window along the spatial dimensions: per dimension the
    kernel, stride, dilation and the padding before and after."""

    kernel: tuple
    strides: tuple
    dilations: tuple
    before: tuple
    after: tuple

    @property
    def padding(self) -> tuple:
        """The 2-D operators' form: every dimension's padding before, then after."""
        return (*self.before, *self.after)

    def unit(self, at: int) -> Window:
        """The same window with a dimension of its own at ``at`` where it does nothing (kernel,
        stride and dilation 1, no padding): a 1-D window over a unit height is a 2-D one."""
        def put(values, value):
            return (*values[:at], value, *values[at:])
        return Window(put(self.kernel, 1), put(self.strides, 1), put(self.dilations, 1),
                      put(self.before, 0), put(self.after, 0))

    def part(self, dims: slice) -> Window:
        """The window of the dimensions ``dims`` only."""
        return Window(self.kernel[dims], self.strides[dims], self.dilations[dims],
                      self.before[dims], self.after[dims])


def _spatial_rank(x, what: str) -> int:
    """1, 2 or 3: the spatial dimensions of an [N, C, ...] input."""
    nsp = len(x.shape) - 2
    if nsp not in (1, 2, 3):
        raise Unsupported(f"{what} of a {len(x.shape)}-D input {list(x.shape)} (1-D, 2-D and "
                          "3-D are implemented: [N, C, L], [N, C, H, W], [N, C, D, H, W])")
    return nsp


def _spatial_ints(attrs, name, default, nsp, lo=1):
    """A per-dimension attribute (strides, dilations, kernel_shape...): ``nsp`` integers of at
    least ``lo``."""
    values = attrs.ints(name, default)
    if values is None or len(values) != nsp or any(v < lo for v in values):
        raise ModelError(f"{name} {values} must be {nsp} integers of at least {lo}")
    return tuple(values)


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


def _read_window(ctx, attrs, x, kernel) -> Window:
    """The window of ``x``'s spatial dimensions: ``kernel_shape`` (``kernel`` by default),
    ``strides``, ``dilations``, ``pads`` or ``auto_pad``."""
    spatial = x.shape[2:]
    nsp = len(spatial)
    kernel = _spatial_ints(attrs, "kernel_shape", kernel, nsp)
    strides = _spatial_ints(attrs, "strides", [1] * nsp, nsp)
    dilations = _spatial_ints(attrs, "dilations", [1] * nsp, nsp)
    pads = _spatial_pads(attrs, spatial, kernel, strides, dilations, ctx.op_type)
    return Window(kernel, strides, dilations, tuple(pads[:nsp]), tuple(pads[nsp:]))


def _unit_height(ctx, x):
    """[N, C, L] as [N, C, 1, L]."""
    return reshape(ctx, x, (*x.shape[:2], 1, *x.shape[2:]))


def _conv2d(ctx, x, w, window: Window, groups: int, bias=None, upsample=None):
    """``nn.conv2d`` and its bias (added to the 2-D output: the addition runs in the
    convolution's kernel whatever the rank the output is reshaped to)."""
    extra = {} if upsample is None else {"upsample": tuple(upsample)}
    out = ctx.make("nn.conv2d", [x, w], strides=window.strides, dilation=window.dilations,
                   padding=window.padding, groups=groups, **extra)
    if bias is not None:
        out = ctx.make("add", [out, reshape(ctx, bias, (1, bias.size, 1, 1))])
    return out


def _conv3d(ctx, x, w, window: Window, groups: int, bias=None, upsample=None):
    """A 3-D convolution as one 2-D convolution: the input's depth taps side by side as its
    input channels (``[N * OD, G * KD * C/G, H, W]``, channel ``(g, kd, c)`` the input's
    channel ``g * C/G + c`` at depth ``od * sd + kd * dd``, the depth padded), the weight's
    ``[O, C/G, KD, KH, KW]`` as ``[O, KD * C/G, KH, KW]``: the sum over the depth taps is part
    of the 2-D convolution's reduction. Height and width keep every attribute of the 2-D
    operator (strides, dilations, pads, groups, ConvTranspose's upsampling) and its strategies,
    so nothing is scheduled twice; the price is the unfolded input, ``KD / sd`` times the
    input's size (bounded by ``MAX_UNFOLDED_BYTES``). A ``nn.conv3d`` operator of its own would
    need its compute, its schedules and their knobs beside the 2-D ones."""
    n, c, depth, h, wd = x.shape
    o, cg, kd = w.shape[:3]
    if c != cg * groups or o % groups:
        raise ModelError(f"{ctx.op_type}: {c} input channels, weight {list(w.shape)} and "
                         f"group={groups} do not agree")
    (sd,), (dd,), (pb,), (pe,) = (v[:1] for v in (window.strides, window.dilations,
                                                  window.before, window.after))
    span = (kd - 1) * dd + 1
    od = (depth + pb + pe - span) // sd + 1
    if od <= 0:
        raise ModelError(f"{ctx.op_type}: output depth would be {od} for depth {depth}, kernel "
                         f"depth {kd}")
    unfolded = n * od * kd * c * h * wd * np.dtype(x.dtype).itemsize
    if unfolded > MAX_UNFOLDED_BYTES:
        raise Unsupported(f"a 3-D convolution of {list(x.shape)} by {list(w.shape)} would unfold "
                          f"its input to {unfolded} bytes (at most {MAX_UNFOLDED_BYTES})")
    if pb or pe:
        x = ctx.make("pad", [x], before=(0, 0, pb, 0, 0), after=(0, 0, pe, 0, 0),
                     mode="constant", value=0.0)
    taps = [ctx.make("strided_slice", [x], slices=((2, k * dd, k * dd + (od - 1) * sd + 1, sd),))
            for k in range(kd)]
    stacked = taps[0] if kd == 1 else ctx.make("concatenate", taps, axis=1)
    stacked = reshape(ctx, stacked, (n, kd, groups, cg, od, h, wd))
    stacked = ctx.make("transpose", [stacked], axes=(0, 4, 2, 1, 3, 5, 6))
    planes = reshape(ctx, stacked, (n * od, groups * kd * cg, h, wd))
    weight = ctx.make("transpose", [w], axes=(0, 2, 1, 3, 4))
    weight = reshape(ctx, weight, (o, kd * cg, *w.shape[3:]))
    out = _conv2d(ctx, planes, weight, window.part(slice(1, 3)), groups, bias, upsample)
    out = reshape(ctx, out, (n, od, *out.shape[1:]))
    return ctx.make("transpose", [out], axes=(0, 2, 1, 3, 4))


def _conv_nd(ctx, x, w, window: Window, groups: int, args, upsample=None):
    """The convolution of ``x``'s 1, 2 or 3 spatial dimensions by the 2-D operator (1-D over a
    unit height, 3-D by :func:`_conv3d`), with the bias ``args[2]`` if there is one."""
    nsp = len(x.shape) - 2
    bias = args[2] if len(args) > 2 else None
    if nsp == 2:
        return _conv2d(ctx, x, w, window, groups, bias, upsample)
    if nsp == 3:
        return _conv3d(ctx, x, w, window, groups, bias, upsample)
    out = _conv2d(ctx, _unit_height(ctx, x), _unit_height(ctx, w), window.unit(0), groups, bias,
                  None if upsample is None else (1, *upsample))
    return reshape(ctx, out, (*out.shape[:2], out.shape[3]))


@converter("Conv")
def _conv(ctx, args, attrs):
    x, w = args[0], args[1]
    nsp = _spatial_rank(x, "Conv")
    if len(w.shape) != nsp + 2:
        raise ModelError(f"the weight of a {nsp}-D convolution must be {nsp + 2}-D, got "
                         f"{list(w.shape)}")
    window = _read_window(ctx, attrs, x, list(w.shape[2:]))
    if list(window.kernel) != list(w.shape[2:]):
        raise ModelError(f"kernel_shape {list(window.kernel)} does not match the weight "
                         f"{list(w.shape)}")
    groups = int(attrs.get("group", 1))
    if groups <= 0:
        raise ModelError(f"group {groups} must be positive")
    return [_conv_nd(ctx, x, w, window, groups, args)]


def _transposed_pads(attrs, x, kernel, strides, dilations, out_pad):
    """The pads of a ConvTranspose, per spatial dimension ``(before, after)``: its ``pads``,
    or those that make ``output_shape`` (an ``after`` below 0 when the output reaches past
    what the kernel covers), or ``auto_pad``'s."""
    nsp = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={auto!r}")
    out_shape = attrs.ints("output_shape", None)
    if out_shape is not None and (len(out_shape) not in (nsp, nsp + 2) or min(out_shape) <= 0):
        raise ModelError(f"output_shape {out_shape} must be {nsp} (or {nsp + 2}) positive "
                         "integers")
    pads = attrs.ints("pads", [0] * (2 * nsp))
    if len(pads) != 2 * nsp or any(p < 0 for p in pads):
        raise ModelError(f"ConvTranspose: pads {pads} must be {2 * nsp} non-negative integers")
    if auto == "VALID":
        return [0] * nsp, [0] * nsp
    if out_shape is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        return pads[:nsp], pads[nsp:]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    target = out_shape[-nsp:] if out_shape is not None else [
        size * s for size, s in zip(x.shape[2:], strides)]
    begin, end = [], []
    for size, s, sp, op, t in zip(x.shape[2:], strides, spans, out_pad, target):
        total = s * (size - 1) + op + sp - t
        if total < 0:                             # more output than the kernel covers:
            begin.append(0)                       # the rest is added at the end
            end.append(total)
            continue
        upper = auto == "SAME_UPPER"
        begin.append(total // 2 if upper else total - total // 2)
        end.append(total - total // 2 if upper else total // 2)
    return begin, end


@converter("ConvTranspose")
def _conv_transpose(ctx, args, attrs):
    """A transposed convolution is a convolution over the input upsampled by the stride (zeros
    between elements), padded by the kernel's span less the pads, with the flipped kernel."""
    x, w = args[0], args[1]
    nsp = _spatial_rank(x, "ConvTranspose")
    if len(w.shape) != nsp + 2:
        raise ModelError(f"the weight of a {nsp}-D transposed convolution must be {nsp + 2}-D, "
                         f"got {list(w.shape)}")
    groups = int(attrs.get("group", 1))
    c, ocg, *kernel = w.shape
    if groups <= 0 or c % groups or c != x.shape[1]:
        raise ModelError(f"weight {list(w.shape)}, {x.shape[1]} input channels and "
                         f"group={groups} do not agree")
    if list(_spatial_ints(attrs, "kernel_shape", kernel, nsp)) != kernel:
        raise ModelError("kernel_shape does not match the weight")
    strides = _spatial_ints(attrs, "strides", [1] * nsp, nsp)
    dilations = _spatial_ints(attrs, "dilations", [1] * nsp, nsp)
    out_pad = _spatial_ints(attrs, "output_padding", [0] * nsp, nsp, lo=0)
    begin, end = _transposed_pads(attrs, x, kernel, strides, dilations, out_pad)
    if nsp < 3 and w.is_const and set(dilations) == {1} and max(strides) > 1:
        bias = args[2] if len(args) > 2 else None
        if nsp == 2:
            return [_subpixel(ctx, x, w.value, groups, strides, begin, end, out_pad, bias)]
        out = _subpixel(ctx, _unit_height(ctx, x), w.value[:, :, None], groups, (1, *strides),
                        (0, *begin), (0, *end), (0, *out_pad), bias)
        return [reshape(ctx, out, (*out.shape[:2], out.shape[3]))]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    # [C, O/G, K...] -> [O, C/G, K...], the window reversed (folded for a constant weight)
    flipped = reshape(ctx, w, (groups, c // groups, ocg, *kernel))
    flipped = ctx.make("transpose", [flipped], axes=(0, 2, 1, *range(3, nsp + 3)))
    flipped = reshape(ctx, flipped, (groups * ocg, c // groups, *kernel))
    flipped = ctx.make("strided_slice", [flipped], slices=tuple(
        (2 + k, size - 1, -1, -1) for k, size in enumerate(kernel)))
    window = Window(tuple(kernel), (1,) * nsp, dilations,
                    tuple(sp - 1 - b for sp, b in zip(spans, begin)),
                    tuple(sp - 1 - e + op for sp, e, op in zip(spans, end, out_pad)))
    if nsp == 3:
        x, window = _upsample_depth(ctx, x, strides[0], window)
    return [_conv_nd(ctx, x, flipped, window, groups, args,
                     upsample=strides[-2:] if nsp > 1 else strides)]


def _subpixel(ctx, x, weight: np.ndarray, groups: int, strides, begin, end, out_pad, bias):
    """A 2-D transposed convolution of stride ``s`` (per dimension) as one convolution of the
    input itself, with ``sh * sw`` times the output channels, and a pixel shuffle: output
    ``s * m + p`` of a dimension sums ``x[m - j] * w[s * j + p]`` over the ``ceil(k / s)``
    taps ``j``, a correlation of the input padded by ``ceil(k / s) - 1`` with phase ``p``'s
    taps reversed. Upsampling with zeros first (the general path) spends ``sh * sw`` times the
    multiply-adds on zeros. The convolution's output is ``[N, (O, sh, sw), H', W']``; the
    shuffle interleaves the phases, the crop applies the pads and output padding (past what
    the kernel covers the output is zero: the input is padded further on the right)."""
    c, ocg, *kernel = weight.shape
    taps = [-(-k // st) for k, st in zip(kernel, strides)]
    spread = np.zeros((c, ocg, *(t * st for t, st in zip(taps, strides))), weight.dtype)
    spread[:, :, :kernel[0], :kernel[1]] = weight
    # [C, O/G, t, s] per dimension -> [G, O/G, sh, sw, C/G, th, tw], each tap axis reversed
    phases = spread.reshape(groups, c // groups, ocg, taps[0], strides[0], taps[1], strides[1])
    phases = phases.transpose(0, 2, 4, 6, 1, 3, 5)[..., ::-1, ::-1]
    phases = np.ascontiguousarray(phases).reshape(
        groups * ocg * strides[0] * strides[1], c // groups, *taps)
    lengths = [st * (size - 1) + op + k - b - e for size, st, op, k, b, e in
               zip(x.shape[2:], strides, out_pad, kernel, begin, end)]
    covered = [st * (size + t - 1) for size, st, t in zip(x.shape[2:], strides, taps)]
    extra = [max(0, -(-(b + n - cov) // st)) for b, n, cov, st in
             zip(begin, lengths, covered, strides)]
    window = Window(tuple(taps), (1, 1), (1, 1), tuple(t - 1 for t in taps),
                    tuple(t - 1 + e for t, e in zip(taps, extra)))
    out = _conv2d(ctx, x, ir.const(phases, "subpixel"), window, groups)
    n, _, hp, wp = out.shape
    o = groups * ocg
    out = reshape(ctx, out, (n, o, strides[0], strides[1], hp, wp))
    out = ctx.make("transpose", [out], axes=(0, 1, 4, 2, 5, 3))
    out = reshape(ctx, out, (n, o, hp * strides[0], wp * strides[1]))
    out = ctx.make("strided_slice", [out], slices=tuple(
        (2 + k, b, b + length, 1) for k, (b, length) in enumerate(zip(begin, lengths))))
    if bias is not None:
        out = ctx.make("add", [out, reshape(ctx, bias, (1, bias.size, 1, 1))])
    return out


def _upsample_depth(ctx, x, stride: int, window: Window):
    """``x`` with ``stride - 1`` zeros between its depth slices (what the 2-D operator's
    ``upsample`` does for height and width), and the window's depth padding less the
    ``stride - 1`` zero slices left at the end."""
    if stride == 1:
        return x, window
    n, c, depth, h, w = x.shape
    spread = reshape(ctx, x, (n, c, depth, 1, h * w))
    spread = ctx.make("pad", [spread], before=(0,) * 5, after=(0, 0, 0, stride - 1, 0),
                      mode="constant", value=0.0)
    spread = reshape(ctx, spread, (n, c, depth * stride, h, w))
    after = (window.after[0] - (stride - 1), *window.after[1:])
    return spread, Window(window.kernel, window.strides, window.dilations, window.before, after)


def _dense(ctx, a, b_value, name):
    """``a @ b`` for a 2-D constant ``b``; ``a`` of any rank >= 2 (leading dimensions folded)."""
    lead = a.shape[:-1]
    flat = reshape(ctx, a, (math.prod(lead), a.shape[-1])) if len(a.shape) != 2 else a
    out = ctx.make("nn.dense", [flat, ir.const(np.ascontiguousarray(b_value), name)])
    return reshape(ctx, out, (*lead, b_value.shape[1])) if len(a.shape) != 2 else out


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
        a2 = reshape(ctx, a, (1, a.shape[0])) if len(a.shape) == 1 else a
        b2 = reshape(ctx, b, (b.shape[0], 1)) if len(b.shape) == 1 else b
        out = _matmul(ctx, [a2, b2], attrs)[0]
        shape = list(out.shape)
        if len(a.shape) == 1:
            shape.pop(-2)
        if len(b.shape) == 1:
            shape.pop(-1)
        return [reshape(ctx, out, shape)]
    if b.is_const and len(b.shape) == 2:
        if a.shape[-1] != b.shape[0]:
            raise ModelError(f"MatMul of {list(a.shape)} and {list(b.shape)}")
        return [_dense(ctx, a, b.value, b.name)]
    return [ctx.make("nn.batch_matmul", [a, b])]




def _softmax_1(ctx, args, attrs, log):
    """Before opset 13 the input is taken as 2-D, flattened at ``axis``."""
    x = args[0]
    ndim = len(x.shape)
    axis = normalize_axis(int(attrs.get("axis", 1)), ndim)
    if axis == ndim - 1:
        return [ctx.make("nn.softmax", [x], axis=axis, log=log)]
    flat = reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    out = ctx.make("nn.softmax", [flat], axis=1, log=log)
    return [reshape(ctx, out, x.shape)]


def _softmax_13(ctx, args, attrs, log):
    axis = normalize_axis(int(attrs.get("axis", -1)), len(args[0].shape))
    return [ctx.make("nn.softmax", [args[0]], axis=axis, log=log)]


for _op, _log in (("Softmax", False), ("LogSoftmax", True)):
    converter(_op)(partial(_softmax_1, log=_log))
    converter(_op, since=13)(partial(_softmax_13, log=_log))


@converter("BatchNormalization")
def _batch_norm(ctx, args, attrs):
    x = args[0]
    eps = float(attrs.get("epsilon", 1e-5))
    attrs.ignore("momentum")
    if int(attrs.get("training_mode", 0)):
        raise Unsupported("training_mode=1 (batch statistics) is not implemented")
    scale, bias, mean, var = (ctx.constant(a, f"BatchNormalization's {n}") for a, n in
                              zip(args[1:5], ("scale", "B", "mean", "var")))
    if len(x.shape) < 2 or any(v.shape != (x.shape[1],) for v in (scale, bias, mean, var)):
        raise ModelError(f"BatchNormalization of {list(x.shape)}: the statistics must have "
                         f"{x.shape[1] if len(x.shape) > 1 else '?'} entries")
    spread = var.astype(np.float64) + eps
    if not np.all(spread > 0):
        raise ModelError(f"BatchNormalization: var + epsilon must be positive, got "
                         f"{float(spread.min())} (the statistics are not a variance)")
    a = (scale / np.sqrt(spread)).astype(x.dtype)
    b = (bias - mean * a).astype(x.dtype)
    shape = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
    out = ctx.make("multiply", [x, ir.const(a.reshape(shape))])
    out = ctx.make("add", [out, ir.const(b.reshape(shape))])
    out.origin = ("BatchNormalization",)
    return [out]


def _pool(ctx, args, attrs, kind):
    """Pooling of 1, 2 or 3 spatial dimensions by the 2-D operator: 1-D over a unit height;
    3-D as two poolings, of height and width (depth slices as channels), then of depth (height
    and width flattened into one dimension the window does not move along): a maximum or an
    average over a box is the maximum or average over depth of those over the box's planes
    (an average's count of elements is the product of the dimensions' counts, padding
    included or not, so the two divisions make the one)."""
    x = args[0]
    nsp = _spatial_rank(x, ctx.op_type)
    window = _read_window(ctx, attrs, x, None)
    ceil = bool(int(attrs.get("ceil_mode", 0)))
    include = bool(int(attrs.get("count_include_pad", 0))) if kind == "avg" else False
    if kind == "max" and int(attrs.get("storage_order", 0)):
        raise Unsupported("storage_order=1 is not implemented")

    def pool2d(data, win):
        return ctx.make("nn.pool2d", [data], kind=kind, kernel=win.kernel, strides=win.strides,
                        dilation=win.dilations, padding=win.padding, ceil_mode=ceil,
                        count_include_pad=include)
    if nsp == 2:
        return [pool2d(x, window)]
    if nsp == 1:
        out = pool2d(_unit_height(ctx, x), window.unit(0))
        return [reshape(ctx, out, (*out.shape[:2], out.shape[3]))]
    n, c, depth, h, w = x.shape
    planes = pool2d(reshape(ctx, x, (n, c * depth, h, w)), window.part(slice(1, 3)))
    oh, ow = planes.shape[2:]
    out = pool2d(reshape(ctx, planes, (n, c, depth, oh * ow)), window.part(slice(0, 1)).unit(1))
    return [reshape(ctx, out, (n, c, out.shape[2], oh, ow))]


# MaxPool 22 and AveragePool 22 say that windows starting in the right padding are dropped
# (as nn.pool2d's ceil_mode always did); AveragePool 19 adds dilations
@converter("MaxPool")
@converter("MaxPool", since=22)
def _max_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "max")


@converter("AveragePool")
@converter("AveragePool", since=19)
@converter("AveragePool", since=22)
def _avg_pool(ctx, args, attrs):
    return _pool(ctx, args, attrs, "avg")


@converter("LpPool", since=11)
@converter("LpPool", since=18)
@converter("LpPool", since=22)
def _lp_pool(ctx, args, attrs):
    """``(sum |x|^p) ^ (1/p)`` over each window: the average of ``|x|^p`` counting the padding
    (zeros, which add nothing) times the window's size. A ceil-mode window reaching past the
    padding would count fewer elements, so ceil_mode=1 is refused."""
    if int(attrs.get("ceil_mode", 0)):
        raise Unsupported("ceil_mode=1 is not implemented")
    x = args[0]
    p = float(attrs.get("p", 2))
    if p <= 0:
        raise ModelError(f"LpPool's p {p:g} must be positive")
    powered = _lp_power(ctx, x, p)
    mean = _pool(ctx, [powered], _AttrsWith(attrs, count_include_pad=1), "avg")[0]
    window = _spatial_ints(attrs, "kernel_shape", None, len(x.shape) - 2)
    return [_lp_root(ctx, mean, math.prod(window), p)]


@converter("GlobalLpPool", since=2)
def _global_lp_pool(ctx, args, attrs):
    x = args[0]
    p = float(attrs.get("p", 2))
    if p <= 0:
        raise ModelError(f"GlobalLpPool's p {p:g} must be positive")
    mean = ctx.make("nn.global_pool", [_lp_power(ctx, x, p)], kind="avg")
    return [_lp_root(ctx, mean, math.prod(x.shape[2:]), p)]


def _lp_power(ctx, x, p: float):
    magnitude = ctx.make("abs", [x])
    return magnitude if p == 1 else ctx.make(
        "power", [magnitude, ir.const(np.asarray(p, x.dtype))])


def _lp_root(ctx, mean, count: int, p: float):
    total = ctx.make("multiply", [mean, ir.const(np.asarray(count, mean.dtype))])
    return total if p == 1 else ctx.make(
        "power", [total, ir.const(np.asarray(1 / p, mean.dtype))])


class _AttrsWith:
    """A node's attributes with some replaced (LpPool read as an AveragePool)."""

    def __init__(self, attrs, **values):
        self._attrs, self._values = attrs, values

    def get(self, name, default=None):
        return self._values[name] if name in self._values else self._attrs.get(name, default)

    def ints(self, name, default=None):
        return self._attrs.ints(name, default)


def _global_pool(ctx, args, attrs, kind):
    return [ctx.make("nn.global_pool", [args[0]], kind=kind)]


converter("GlobalAveragePool")(partial(_global_pool, kind="avg"))
converter("GlobalMaxPool")(partial(_global_pool, kind="max"))


@converter("LRN")
def _lrn(ctx, args, attrs):
    size = int(attrs.get("size"))
    if size <= 0:
        raise ModelError(f"LRN size {size} must be positive")
    if len(args[0].shape) < 3:
        raise ModelError("LRN needs N, C and spatial dimensions")
    return [ctx.make("nn.lrn", [args[0]], size=size, alpha=float(attrs.get("alpha", 1e-4)),
                     beta=float(attrs.get("beta", 0.75)), bias=float(attrs.get("bias", 1.0)))]


