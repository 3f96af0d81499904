"""Operators of a static output shape whose sizes or offsets are read from tensors at run
time (an ONNX Reshape, Expand, Split, Tile, Resize, Slice or Pad given a computed shape, sizes,
starts or pads, the output's shape known from the model): ``expect_values`` passes its input
on once a run-time size vector is what the static shape needs, ``dynamic_slice`` reads at
run-time starts, ``dynamic_pad`` places its input at run-time offsets. They are
``OpDef.checked``: when the values read do not give the static shape, the kernel reads before
its input's buffer and the run stops with a KernelError, never a wrong answer."""
from __future__ import annotations

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .index import _checked_load
from .registry import register, static_shape


def _guard(x, index, valid):
    """``x[index]``, or a read before ``x``'s buffer when ``valid`` does not hold."""
    return _checked_load(x, index, valid, {0})


# ------------------------------------------------------------------ expect_values

def _expect_infer(inputs, attrs):
    x, values = inputs
    if values.shape != (len(attrs["allowed"]),) or values.dtype not in ("int32", "int64") or \
            not x.shape:
        raise ModelError(f"expect_values on {values.size} {values.dtype} values for "
                         f"{len(attrs['allowed'])} entries (of a tensor of rank {len(x.shape)})")
    return x.shape, x.dtype


def _values_ok(values, attrs):
    """Whether run-time ``values`` (a te tensor) hold what ``attrs`` allow: each element one of
    its ``allowed`` set, and ``once`` (when not None) at most one of them."""
    dt = values.dtype
    entries = [values[k] for k in range(len(attrs["allowed"]))]
    conds = [E.any_of(*(v == te.const(a, dt) for a in allowed))
             for v, allowed in zip(entries, attrs["allowed"])]
    once = attrs["once"]
    if once is not None and len(entries) > 1:
        one, zero = te.const(1, "int32"), te.const(0, "int32")
        count = None
        for v in entries:
            hit = E.if_then_else(v == te.const(once, dt), one, zero)
            count = hit if count is None else count + hit
        conds.append(count <= 1)
    return E.all_of(*conds)


def _expect(ts, attrs, node):
    x, values = ts

    def body(*idx):
        return _guard(x, idx, _values_ok(values, attrs))
    return te.compute(node.shape, body, name="expect_values")


register("expect_values", "injective", _expect_infer, _expect, checked=True)


# ------------------------------------------------------------------ dynamic_slice

def _slice_infer(inputs, attrs):
    x, starts, ends = inputs
    axes, steps, shape = attrs["axes"], attrs["steps"], attrs["shape"]
    if not (starts.shape == ends.shape == (len(axes),) and len(steps) == len(axes)) or \
            len(shape) != len(x.shape) or any(s == 0 for s in steps) or \
            any(d != shape[k] for k, d in enumerate(x.shape) if k not in axes) or \
            starts.dtype not in ("int32", "int64") or ends.dtype not in ("int32", "int64"):
        raise ModelError(f"dynamic_slice of {list(x.shape)} to {list(shape)} along {list(axes)}")
    return tuple(shape), x.dtype


def _clamped(value, dim: int, low: int, high: int):
    """ONNX Slice's start or end ``value`` (int64, run time) counted from the end when
    negative and clamped into ``[low, high]``, as int32."""
    dt = value.dtype
    value = E.if_then_else(value < te.const(0, dt), value + te.const(dim, dt), value)
    return E.cast(E.minimum(E.maximum(value, te.const(low, dt)), te.const(high, dt)), "int32")


def _dynamic_slice(ts, attrs, node):
    x, starts, ends = ts
    dims = static_shape(x)
    axes, steps, shape = attrs["axes"], attrs["steps"], attrs["shape"]

    def body(*idx):
        index, conds = list(idx), []
        for k, (axis, step) in enumerate(zip(axes, steps)):
            d = dims[axis]         # ONNX's clamps: [0, d] forward; backward [0, d-1], [-1, d-1]
            begin = _clamped(starts[k], d, 0, d if step > 0 else d - 1)
            end = _clamped(ends[k], d, 0 if step > 0 else -1, d if step > 0 else d - 1)
            span = end - begin if step > 0 else begin - end
            stride = abs(step)
            count = E.if_then_else(span > 0, E.floordiv(span + (stride - 1), stride), 0)
            conds.append(count == shape[axis])
            index[axis] = begin + idx[axis] * step
        return _checked_load(x, tuple(index), E.all_of(*conds), set(axes))
    return te.compute(node.shape, body, name="dynamic_slice")


register("dynamic_slice", "injective", _slice_infer, _dynamic_slice, checked=True)


# ------------------------------------------------------------------ dynamic_pad

def _pad_infer(inputs, attrs):
    x, pads, *fill = inputs
    axes, shape = attrs["axes"], attrs["shape"]
    if pads.shape != (2 * len(axes),) or len(shape) != len(x.shape) or \
            pads.dtype not in ("int32", "int64") or any(d <= 0 for d in shape) or \
            any(d != shape[k] for k, d in enumerate(x.shape) if k not in axes) or \
            any(f.shape != () or f.dtype != x.dtype for f in fill):
        raise ModelError(f"dynamic_pad of {list(x.shape)} to {list(shape)} by "
                         f"{list(pads.shape)} pads along {list(axes)}")
    return tuple(shape), x.dtype


#: run-time pads beyond this are refused by the kernel (its offsets are int32)
_MAX_OFFSET = 2 ** 30


def _dynamic_pad(ts, attrs, node):
    """Output element ``i`` reads ``x[i - before]`` along each padded axis: where that is
    outside ``x``, the value (``mode`` constant: attribute ``value``, or a 0-d third input read
    at run time), the nearest element (edge) or the mirrored one (reflect: pads must then be
    in ``[0, dim)``). The pads of each padded axis must add up to its growth; when they do
    not, every element reads, and the first read fails."""
    x, pads, *fill = ts
    dims, shape, axes, mode = static_shape(x), attrs["shape"], attrs["axes"], attrs["mode"]
    dt = pads.dtype

    def body(*idx):
        valid, index, inside = [], list(idx), []
        for k, axis in enumerate(axes):
            before, after, d = pads[k], pads[k + len(axes)], dims[axis]
            valid += [before + after == te.const(shape[axis] - d, dt),
                      before > te.const(-_MAX_OFFSET, dt), before < te.const(_MAX_OFFSET, dt)]
            j = idx[axis] - E.cast(before, "int32")
            if mode == "reflect":
                valid += [before >= te.const(0, dt), before < te.const(d, dt),
                          after >= te.const(0, dt), after < te.const(d, dt)]
                j = E.if_then_else(j < 0, -j, E.if_then_else(j >= d, 2 * (d - 1) - j, j))
            inside += [j >= 0, j < d]
            index[axis] = E.minimum(E.maximum(j, 0), d - 1)
        ok = E.all_of(*valid)
        value = _guard(x, tuple(index), ok)
        if mode != "constant":
            return value
        return E.if_then_else(E.logical_or(E.all_of(*inside), E.logical_not(ok)), value,
                              fill[0][()] if fill else te.const(attrs["value"], x.dtype))
    return te.compute(node.shape, body, name="dynamic_pad")


register("dynamic_pad", "injective", _pad_infer, _dynamic_pad, checked=True)
