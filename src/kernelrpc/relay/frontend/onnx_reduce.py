"""ONNX converters of the reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceL1,
ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceProd, ReduceSumSquare: an elementwise step, the
``reduce`` operator, an elementwise step), the selections ArgMax, ArgMin and TopK, CumSum and
Einsum."""
from __future__ import annotations

import string

from ..errors import ModelError
from .onnx_activation import check_dtype
from .onnx_common import Unsupported, converter, normalize_axis, reshape

_INTS = ("int32", "int64")
_FLOAT = ("float32",)
#: the longest axis TopK and CumSum take (their kernels are quadratic in it)
MAX_SCAN_AXIS = 1 << 16

#: op type -> (elementwise step before, reduction, step after, the dtypes implemented (None:
#: every one); ReduceMean's integer mean is refused: the operator scales by a float reciprocal)
_REDUCE = {"ReduceSum": (None, "sum", None, None),
           "ReduceMean": (None, "mean", None, _FLOAT),
           "ReduceMax": (None, "max", None, None),
           "ReduceMin": (None, "min", None, None),
           "ReduceL1": ("abs", "sum", None, _FLOAT + _INTS),
           "ReduceL2": ("square", "sum", "sqrt", _FLOAT),
           "ReduceSumSquare": ("square", "sum", None, _FLOAT + _INTS),
           "ReduceLogSum": (None, "sum", "log", _FLOAT),
           "ReduceProd": (None, "prod", None, _FLOAT + _INTS),
           "ReduceLogSumExp": (None, "logsumexp", None, _FLOAT)}


def _log_sum_exp(ctx, x, axes, keep):
    """``log(sum(exp(x - max))) + max``: no overflow for large inputs."""
    top = ctx.make("reduce", [x], kind="max", axes=tuple(axes), keepdims=True)
    shifted = ctx.make("exp", [ctx.make("subtract", [x, top])])
    total = ctx.make("reduce", [shifted], kind="sum", axes=tuple(axes), keepdims=True)
    out = ctx.make("add", [ctx.make("log", [total]), top])
    if keep:
        return out
    return reshape(ctx, out, [d for k, d in enumerate(x.shape) if k not in axes])


def _reduce(ctx, args, attrs, axes, noop):
    """``axes`` as written (none: every axis, or none at all with ``noop``, the
    ``noop_with_empty_axes`` of the axes-input form: then only the elementwise steps)."""
    x = args[0]
    before, kind, after, dtypes = _REDUCE[ctx.op_type]
    if dtypes is not None:
        check_dtype(ctx, x, dtypes)
    keep = bool(int(attrs.get("keepdims", 1)))
    ndim = len(x.shape)
    if axes:
        axes = sorted({normalize_axis(a, ndim) for a in axes})
    else:
        axes = [] if noop else list(range(ndim))
    if before == "abs":
        x = ctx.make("abs", [x])
    elif before == "square":
        x = ctx.make("multiply", [x, x])
    if not axes:
        out = x
    elif kind == "logsumexp":
        return [_log_sum_exp(ctx, x, axes, keep)]
    else:
        out = ctx.make("reduce", [x], kind=kind, axes=tuple(axes), keepdims=keep)
    return [ctx.make(after, [out]) if after else out]


def _axes_attribute(ctx, args, attrs):
    return _reduce(ctx, args, attrs, attrs.ints("axes", []), noop=False)


def _axes_input(ctx, args, attrs):
    """Axes as an optional input, and ``noop_with_empty_axes`` (read whatever the axes:
    exporters write ``noop_with_empty_axes=0`` beside them)."""
    noop = bool(int(attrs.get("noop_with_empty_axes", 0)))
    axes = ctx.optional_ints(args, 1, f"{ctx.op_type}'s axes") or []
    return _reduce(ctx, args, attrs, axes, noop)


for _op in _REDUCE:
    converter(_op)(_axes_attribute)
    converter(_op, since=13 if _op == "ReduceSum" else 18)(_axes_input)
converter("ReduceMax", "ReduceMin", since=20)(_axes_input)     # bool inputs added


@converter("ArgMax", "ArgMin")
def _argreduce(ctx, args, attrs):
    x = args[0]
    check_dtype(ctx, x, ("float32",) + _INTS)
    axis = normalize_axis(int(attrs.get("axis", 0)), len(x.shape))
    last = bool(int(attrs.get("select_last_index", 0))) if ctx.opset >= 12 else False
    return [ctx.make("argreduce", [x], kind="max" if ctx.op_type == "ArgMax" else "min",
                     axis=axis, keepdims=bool(int(attrs.get("keepdims", 1))),
                     select_last_index=last)]


def _scan_axis(ctx, x, axis):
    axis = normalize_axis(axis, len(x.shape))
    if x.shape[axis] > MAX_SCAN_AXIS:
        raise Unsupported(f"{ctx.op_type} along an axis of {x.shape[axis]} elements (at most "
                          f"{MAX_SCAN_AXIS})")
    return axis


@converter("TopK")
def _topk(ctx, args, attrs):
    """Values and indices sorted (what ``sorted=0`` allows too)."""
    x = args[0]
    check_dtype(ctx, x, ("float32",) + _INTS)
    axis = _scan_axis(ctx, x, int(attrs.get("axis", -1)))
    if ctx.opset >= 10:
        k = ctx.constant(args[1], "TopK's K").reshape(-1)
        if k.size != 1:
            raise ModelError(f"TopK's K must hold one value, got {k.size}")
        k = int(k[0])
    else:
        k = int(attrs.get("k"))
    largest = bool(int(attrs.get("largest", 1))) if ctx.opset >= 11 else True
    if ctx.opset >= 11:
        attrs.get("sorted")
    if not 0 < k <= x.shape[axis]:
        raise ModelError(f"TopK's K={k} for an axis of {x.shape[axis]}")
    return [ctx.make("topk", [x], axis=axis, k=k, largest=largest, output=output)
            for output in ("values", "indices")]


@converter("CumSum")
def _cumsum(ctx, args, attrs):
    x = args[0]
    check_dtype(ctx, x, ("float32",) + _INTS)
    axis = ctx.constant(args[1], "CumSum's axis").reshape(-1)
    if axis.size != 1 or axis.dtype.kind not in "iu":
        raise ModelError(f"CumSum's axis must be one integer, got {axis}")
    axis = _scan_axis(ctx, x, int(axis[0]))
    return [ctx.make("cumsum", [x], axis=axis, exclusive=bool(int(attrs.get("exclusive", 0))),
                     reverse=bool(int(attrs.get("reverse", 0))))]


def parse_einsum(equation: str, ndims: list[int]) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, each ``...`` spelled out as letters no term
    uses, aligned from the right (the output implicit when there is no ``->``: the ellipsis,
    then the letters used once, sorted)."""
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ModelError(f"Einsum {equation!r} names {len(terms)} operands, {len(ndims)} given")
    letters = set(equation) - set(".,->")
    if not all(c.isascii() and c.isalpha() for c in letters):
        raise ModelError(f"Einsum {equation!r}: subscripts must be letters")
    widths = [ndim - len(term.replace("...", "")) if "..." in term else 0
              for term, ndim in zip(terms, ndims)]
    free = [c for c in string.ascii_letters if c not in letters][:max(widths)]
    ellipsis = "".join(free)
    spelled = []
    for term, ndim, width in zip(terms, ndims, widths):
        term = term.replace("...", ellipsis[len(ellipsis) - width:], 1)
        if "." in term or len(term) != ndim:
            raise ModelError(f"Einsum term {term!r} for {ndim} dimensions")
        spelled.append(term)
    if not arrow:
        used = "".join(t.replace("...", "") for t in terms)
        out = ellipsis + "".join(sorted(c for c in letters if used.count(c) == 1))
    else:
        out = out.replace("...", ellipsis, 1)
    if "." in out or len(set(out)) != len(out) or not set(out) <= set("".join(spelled)):
        raise ModelError(f"Einsum {equation!r}: output subscripts {out!r}")
    return spelled, out


@converter("Einsum")
def _einsum(ctx, args, attrs):
    equation = str(attrs.get("equation"))
    if len(equation) > 256:
        raise ModelError(f"Einsum equation of {len(equation)} characters")
    for x in args:
        check_dtype(ctx, x, ("float32",) + _INTS)
    terms, out = parse_einsum(equation, [len(x.shape) for x in args])
    sizes = {}
    for term, x in zip(terms, args):
        for letter, d in zip(term, x.shape):
            if sizes.setdefault(letter, d) != d:
                raise Unsupported(f"Einsum {equation!r} broadcasting a dimension of "
                                  f"{min(d, sizes[letter])} against {max(d, sizes[letter])}")
    if len(args) == 1 and terms[0] == out:
        return [args[0]]
    return [ctx.make("einsum", args, terms=tuple(terms), output=out)]
