"""ONNX converters of the shape and data-movement operators: Flatten, Reshape, Squeeze,
Transpose, Concat, Split, Slice, Pad, Expand, Tile, Range, Constant, Shape,
Resize...

A shape, split, starts, ends, pads, repeats or sizes input computed at run time is accepted
where the output's shape is static all the same (the model's value_info or ONNX's shape
inference gives it): the kernel reads the values and stops the run when they do not give that
shape (``relay/op/dynamic.py``)."""
from __future__ import annotations

import math

import numpy as np

from ...runtime.dtype import MAX_NDIM
from .. import ir
from ..errors import ModelError
from ..op.elemwise import broadcast_shape
from . import onnx_model
from .onnx_common import Unsupported, converter, normalize_axis, reshape


@converter("Flatten")
def _flatten(ctx, args, attrs):
    x = args[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    if not 0 <= axis <= len(x.shape):
        raise ModelError(f"Flatten axis {axis} out of range")
    return [reshape(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _expect(ctx, x, values, allowed, once=None):
    """``x`` once the run-time ``values`` (a 1-D node) are, element by element, among
    ``allowed``: a kernel reading them stops the run when they are not (``expect_values``)."""
    if values.shape != (len(allowed),):
        raise ModelError(f"{len(allowed)} values expected, the input has shape "
                         f"{list(values.shape)}")
    if not x.shape:
        x = reshape(ctx, x, (1,))
    return ctx.make("expect_values", [x, values],
                    allowed=tuple(tuple(sorted(set(a))) for a in allowed), once=once)


@converter("Reshape")
def _reshape_op(ctx, args, attrs):
    x = args[0]
    allowzero = int(attrs.get("allowzero", 0))
    if ctx.known(args[1], "Reshape's shape") is None:
        shape = ctx.static_output_shape(0, "Reshape's shape")
        if math.prod(shape) != x.size:
            raise ModelError(f"Reshape of {list(x.shape)} to {list(shape)}: sizes differ")
        allowed = [{d, -1} | ({0} if not allowzero and k < len(x.shape) and x.shape[k] == d
                             else set()) for k, d in enumerate(shape)]
        return [reshape(ctx, _expect(ctx, x, args[1], allowed, once=-1), shape)]
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
    return [reshape(ctx, x, shape)]


def _squeeze(ctx, x, axes):
    ndim = len(x.shape)
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == 1]
    axes = {normalize_axis(a, ndim) for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise ModelError(f"Squeeze of axes {sorted(axes)} of {list(x.shape)}: not all are 1")
    return [reshape(ctx, x, [d for k, d in enumerate(x.shape) if k not in axes])]


def _unsqueeze(ctx, x, axes):
    if axes is None:
        raise ModelError("Unsqueeze needs axes")
    ndim = len(x.shape) + len(axes)
    shape = list(x.shape)
    for a in sorted(normalize_axis(a, ndim) for a in axes):
        shape.insert(a, 1)
    return [reshape(ctx, x, shape)]


def _axes_versions(op_type, apply):
    """``apply(ctx, x, axes)`` registered for ``op_type``: axes an attribute before opset 13,
    an optional input from it."""
    converter(op_type)(lambda ctx, args, attrs: apply(ctx, args[0], attrs.ints("axes", None)))
    converter(op_type, since=13)(lambda ctx, args, attrs: apply(
        ctx, args[0], ctx.optional_ints(args, 1, f"{op_type}'s axes")))


_axes_versions("Squeeze", _squeeze)
_axes_versions("Unsqueeze", _unsqueeze)


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
    axis = normalize_axis(int(attrs.get("axis")), len(items[0].shape))
    if len(items) == 1:
        return [items[0]]
    return [ctx.make("concatenate", items, axis=axis)]


def _split(ctx, x, axis, split, count):
    axis = normalize_axis(axis, len(x.shape))
    if split is None:
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


@converter("Split")
def _split_1(ctx, args, attrs):
    return _split(ctx, args[0], int(attrs.get("axis", 0)), attrs.ints("split", None),
                  ctx.outputs_wanted)


def _split_input(ctx, args, axis, count):
    """Split's sizes given as an input: constant, or read at run time (each output's shape
    then static in the model, the sizes checked by the kernels)."""
    x = args[0]
    if len(args) < 2 or args[1] is None or ctx.known(args[1], "Split's split") is not None:
        return _split(ctx, x, axis, ctx.optional_ints(args, 1, "Split's split"), count)
    axis = normalize_axis(axis, len(x.shape))
    sizes = [ctx.static_output_shape(k, "Split's split")[axis] for k in range(count)]
    return _split(ctx, _expect(ctx, x, args[1], [{s} for s in sizes]), axis, sizes, count)


@converter("Split", since=13)
def _split_13(ctx, args, attrs):
    return _split_input(ctx, args, int(attrs.get("axis", 0)), ctx.outputs_wanted)


@converter("Split", since=18)
def _split_18(ctx, args, attrs):
    num = attrs.get("num_outputs", None)
    return _split_input(ctx, args, int(attrs.get("axis", 0)),
                        int(num) if num is not None else ctx.outputs_wanted)


def _clamp_slice(start, end, step, dim):
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def _slice(ctx, x, starts, ends, axes, steps):
    ndim = len(x.shape)
    axes = axes if axes is not None else list(range(len(starts or [])))
    steps = steps if steps is not None else [1] * len(starts or [])
    if starts is None or ends is None or not len(starts) == len(ends) == len(axes) == len(steps):
        raise ModelError("Slice: starts, ends, axes and steps must have one entry per axis")
    slices = []
    for start, end, axis, step in zip(starts, ends, axes, steps):
        axis = normalize_axis(axis, ndim)
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


@converter("Slice")
def _slice_1(ctx, args, attrs):
    return _slice(ctx, args[0], attrs.ints("starts", None), attrs.ints("ends", None),
                  attrs.ints("axes", None), None)


@converter("Slice", since=10)
def _slice_10(ctx, args, attrs):
    if all(ctx.known(args[k], f"Slice's {what}") is not None
           for k, what in ((1, "starts"), (2, "ends"))):
        return _slice(ctx, args[0], *(ctx.optional_ints(args, k, f"Slice's {what}") for k, what
                                      in enumerate(("starts", "ends", "axes", "steps"), 1)))
    x, starts = args[0], args[1]
    axes = ctx.optional_ints(args, 3, "Slice's axes (with starts or ends read at run time)")
    steps = ctx.optional_ints(args, 4, "Slice's steps (with starts or ends read at run time)")
    count = starts.size if len(starts.shape) == 1 else -1
    axes = [normalize_axis(a, len(x.shape)) for a in (axes if axes is not None else range(count))]
    steps = steps if steps is not None else [1] * len(axes)
    if len(set(axes)) != len(axes) or 0 in steps or len(steps) != len(axes):
        raise ModelError(f"Slice along axes {axes} by steps {steps}")
    shape = ctx.static_output_shape(0, "Slice's starts or ends")
    return [ctx.make("dynamic_slice", [x, starts, args[2]], axes=tuple(axes),
                     steps=tuple(steps), shape=tuple(shape))]


def _pad(ctx, x, mode, pads, value, axes):
    """``x`` padded (negative pads crop); ``value`` a number, or a node computed at run time."""
    ndim = len(x.shape)
    if mode not in ("constant", "edge", "reflect"):
        raise Unsupported(f"mode={mode!r}")
    axes = [normalize_axis(a, ndim) for a in axes] if axes is not None else list(range(ndim))
    if pads is None or len(pads) != 2 * len(axes):
        raise ModelError(f"Pad: pads {pads} must have two entries per padded axis")
    before, after = [0] * ndim, [0] * ndim
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    crops = tuple((a, -min(b, 0), x.shape[a] + min(e, 0), 1)
                  for a, (b, e) in enumerate(zip(before, after)) if b < 0 or e < 0)
    if any(start >= end for _, start, end, _ in crops):
        raise ModelError(f"Pad: pads {pads} crop all of {list(x.shape)}")
    if crops:
        x = ctx.make("strided_slice", [x], slices=crops)
    before, after = tuple(max(b, 0) for b in before), tuple(max(e, 0) for e in after)
    if not any(before) and not any(after):
        return [x]
    if isinstance(value, ir.Node):      # the padded area chosen by a constant mask
        padded = ctx.make("pad", [x], before=before, after=after, mode=mode, value=0.0)
        mask = np.pad(np.ones(x.shape, bool), list(zip(before, after)))
        return [ctx.make("where", [ir.const(mask), padded, value])]
    return [ctx.make("pad", [x], before=before, after=after, mode=mode, value=value)]


@converter("Pad")
def _pad_2(ctx, args, attrs):
    return _pad(ctx, args[0], attrs.get("mode", "constant"), attrs.ints("pads", None),
                float(attrs.get("value", 0.0)), None)


def _pad_at_run_time(ctx, args, mode):
    """Pads read at run time: the output's static shape from the model, the input placed at
    the run-time offsets by ``dynamic_pad``."""
    x = args[0]
    if mode not in ("constant", "edge", "reflect"):
        raise Unsupported(f"mode={mode!r}")
    fill, value = [], 0.0           # the value: a number, or a node read at run time
    if len(args) > 2 and args[2] is not None and mode == "constant":
        if args[2].is_const:
            value = ctx.optional_float(args, 2, "Pad's constant_value", 0.0)
        else:
            fill = [reshape(ctx, args[2], ())]
    axes = ctx.optional_ints(args, 3, "Pad's axes (with pads read at run time)")
    axes = [normalize_axis(a, len(x.shape)) for a in axes] if axes is not None \
        else list(range(len(x.shape)))
    if len(set(axes)) != len(axes):
        raise ModelError(f"Pad along axes {axes}")
    shape = ctx.static_output_shape(0, "Pad's pads")
    return [ctx.make("dynamic_pad", [x, args[1], *fill], axes=tuple(axes), shape=tuple(shape),
                     mode=mode, value=value)]


@converter("Pad", since=11)
@converter("Pad", since=19)         # mode "wrap" added, refused as every mode not implemented
def _pad_11(ctx, args, attrs):
    mode = attrs.get("mode", "constant")
    if ctx.known(args[1], "Pad's pads") is None:
        return _pad_at_run_time(ctx, args, mode)
    if mode != "constant":
        value = 0.0
    elif len(args) > 2 and args[2] is not None and not args[2].is_const:
        value = args[2]
    else:
        value = ctx.optional_float(args, 2, "Pad's constant_value", 0.0)
    return _pad(ctx, args[0], mode, ctx.optional_ints(args, 1, "Pad's pads"), value,
                ctx.optional_ints(args, 3, "Pad's axes"))


@converter("Dropout")
def _dropout_1(ctx, args, attrs):
    attrs.ignore("ratio")
    return [args[0]]


@converter("Dropout", since=12)
def _dropout_12(ctx, args, attrs):
    attrs.ignore("seed")
    training = ctx.optional(args, 2, "Dropout's training_mode")
    if training is not None and bool(training.reshape(())):
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
def _shape_1(ctx, args, attrs):
    return [ir.const(np.asarray(args[0].shape, np.int64), ctx.node_name)]


@converter("Shape", since=15)
def _shape_15(ctx, args, attrs):
    start, end = int(attrs.get("start", 0)), attrs.get("end", None)
    dims = list(args[0].shape)[start:None if end is None else int(end)]
    return [ir.const(np.asarray(dims, np.int64), ctx.node_name)]


def _expand_at_run_time(ctx, x, spec):
    """Expand's shape read at run time: each value must give the output's static dimension,
    or be 1 where ``x`` has that dimension already."""
    shape = ctx.static_output_shape(0, "Expand's shape")
    count, rank = spec.size, len(shape)
    if broadcast_shape(x.shape, shape) != tuple(shape) or len(spec.shape) != 1 or \
            rank != max(count, len(x.shape)):
        raise ModelError(f"Expand of {list(x.shape)} by {count} values to {list(shape)}")
    own = (None,) * (rank - len(x.shape)) + tuple(x.shape)      # x's dimension at each axis
    if any(own[j] != shape[j] for j in range(rank - count)):
        raise ModelError(f"Expand of {list(x.shape)} to {list(shape)}: dimensions the shape "
                         "does not give differ")
    allowed = [{shape[j]} | ({1} if own[j] == shape[j] else set())
               for j in range(rank - count, rank)]
    return [ctx.make("broadcast_to", [_expect(ctx, x, spec, allowed)], shape=tuple(shape))]


@converter("Expand")
def _expand(ctx, args, attrs):
    x = args[0]
    if ctx.known(args[1], "Expand's shape") is None:
        return _expand_at_run_time(ctx, x, args[1])
    shape = [int(d) for d in ctx.constant(args[1], "Expand's shape").reshape(-1)]
    if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
        raise ModelError(f"Expand to {shape}")
    out_shape = broadcast_shape(x.shape, shape)
    if out_shape == x.shape:
        return [x]
    _check_size(math.prod(out_shape), x.dtype, "Expand")
    return [ctx.make("broadcast_to", [x], shape=tuple(shape))]


@converter("Tile")
def _tile(ctx, args, attrs):
    x = args[0]
    if ctx.known(args[1], "Tile's repeats") is None:
        shape = ctx.static_output_shape(0, "Tile's repeats")
        if len(shape) != len(x.shape) or any(s % d for s, d in zip(shape, x.shape)):
            raise ModelError(f"Tile of {list(x.shape)} to {list(shape)}")
        reps = tuple(s // d for s, d in zip(shape, x.shape))
        checked = _expect(ctx, x, args[1], [{r} for r in reps])
        return [checked if reps == (1,) * len(reps) else ctx.make("tile", [checked], reps=reps)]
    reps = ctx.optional_ints(args, 1, "Tile's repeats")
    if reps == [1] * len(x.shape):
        return [x]
    _check_size(x.size * math.prod(max(r, 0) for r in reps), x.dtype, "Tile")
    return [ctx.make("tile", [x], reps=tuple(reps))]


@converter("Range")
@converter("Range", since=27)
def _range(ctx, args, attrs):
    attrs.ignore("stash_type")      # the precision of float16 and bfloat16, not taken here
    start, limit, delta = (ctx.constant(a, f"Range's {what} (the output's length)").reshape(())
                           for a, what in zip(args, ("start", "limit", "delta")))
    if delta == 0:
        raise ModelError("Range with delta 0")
    count = max(math.ceil((limit - start) / delta), 0)
    _check_size(count, start.dtype, "Range")
    value = start + np.arange(count, dtype=start.dtype) * delta
    return [ir.const(value.astype(start.dtype), ctx.node_name)]


def _check_size(count, dtype, what):
    if count * np.dtype(dtype).itemsize > onnx_model.MAX_TENSOR_BYTES:
        raise ModelError(f"{what} of {count} elements is larger than "
                         f"{onnx_model.MAX_TENSOR_BYTES} bytes")


@converter("Size")
def _size(ctx, args, attrs):
    return [ir.const(np.asarray(args[0].size, np.int64), ctx.node_name)]


def _blocks(ctx, x, blocksize, what):
    if len(x.shape) != 4:
        raise ModelError(f"{what} needs a 4-D (NCHW) input, got {list(x.shape)}")
    if blocksize < 1:
        raise ModelError(f"{what}'s blocksize {blocksize} must be positive")
    return x.shape


@converter("DepthToSpace")
def _depth_to_space(ctx, args, attrs):
    x, b = args[0], int(attrs.get("blocksize"))
    n, c, h, w = _blocks(ctx, x, b, "DepthToSpace")
    mode = attrs.get("mode", "DCR")
    if c % (b * b):
        raise ModelError(f"DepthToSpace: {c} channels are not a multiple of {b}x{b}")
    if mode == "DCR":
        split, perm = (n, b, b, c // (b * b), h, w), (0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        split, perm = (n, c // (b * b), b, b, h, w), (0, 1, 4, 2, 5, 3)
    else:
        raise Unsupported(f"mode={mode!r}")
    moved = ctx.make("transpose", [reshape(ctx, x, split)], axes=perm)
    return [reshape(ctx, moved, (n, c // (b * b), h * b, w * b))]


@converter("SpaceToDepth")
@converter("SpaceToDepth", since=28)        # mode added, DCR (the earlier order) by default
def _space_to_depth(ctx, args, attrs):
    x, b = args[0], int(attrs.get("blocksize"))
    n, c, h, w = _blocks(ctx, x, b, "SpaceToDepth")
    perm = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}.get(attrs.get("mode", "DCR"))
    if perm is None:
        raise Unsupported(f"mode={attrs.get('mode')!r}")
    if h % b or w % b:
        raise ModelError(f"SpaceToDepth: {h}x{w} is not a multiple of {b}x{b}")
    split = reshape(ctx, x, (n, c, h // b, b, w // b, b))
    moved = ctx.make("transpose", [split], axes=perm)
    return [reshape(ctx, moved, (n, c * b * b, h // b, w // b))]


@converter("Trilu", since=14)
def _trilu(ctx, args, attrs):
    x = args[0]
    if len(x.shape) < 2:
        raise ModelError(f"Trilu needs at least 2 dimensions, got {list(x.shape)}")
    k = ctx.optional(args, 1, "Trilu's k")
    rows, cols = x.shape[-2:]
    k = 0 if k is None else max(min(int(k.reshape(())), cols), -rows)
    return [ctx.make("trilu", [x], upper=bool(int(attrs.get("upper", 1))), k=k)]


def _resize(ctx, x, mode, scales, sizes, coord, nearest):
    if len(x.shape) != 4:
        raise Unsupported("only 4-D (NCHW) Resize is implemented")
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


def _scales(ctx, args, k):
    value = ctx.optional(args, k, "Resize's scales")
    return None if value is None or not value.size else value.astype(np.float64).reshape(-1)


@converter("Upsample")
@converter("Resize", since=10)
def _resize_10(ctx, args, attrs):
    return _resize(ctx, args[0], attrs.get("mode", "nearest"), _scales(ctx, args, 1), None,
                   "asymmetric", "floor")


@converter("Resize", since=11)
def _resize_11(ctx, args, attrs):
    mode = attrs.get("mode", "nearest")
    coord = attrs.get("coordinate_transformation_mode", "half_pixel")
    if float(attrs.get("cubic_coeff_a", -0.75)) != -0.75 and mode == "cubic":
        raise Unsupported("cubic Resize")
    if int(attrs.get("exclude_outside", 0)):
        raise Unsupported("exclude_outside=1")
    attrs.ignore("extrapolation_value")
    if int(attrs.get("antialias", 0)):
        raise Unsupported("antialias=1")
    if attrs.get("axes", None) is not None:
        raise Unsupported("Resize with axes")
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Unsupported("keep_aspect_ratio_policy other than 'stretch'")
    if coord == "tf_crop_and_resize":
        raise Unsupported("coordinate_transformation_mode='tf_crop_and_resize'")
    x, nearest = args[0], attrs.get("nearest_mode", "round_prefer_floor")
    if len(args) > 3 and args[3] is not None and ctx.known(args[3], "Resize's sizes") is None:
        sizes = ctx.static_output_shape(0, "Resize's sizes")
        checked = _expect(ctx, x, args[3], [{d} for d in sizes])
        return _resize(ctx, checked, mode, None, list(sizes), coord, nearest)
    return _resize(ctx, x, mode, _scales(ctx, args, 2),
                   ctx.optional_ints(args, 3, "Resize's sizes"), coord, nearest)
