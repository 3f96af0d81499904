"""Elementwise operators: unary activations and binary arithmetic with numpy broadcasting."""
from __future__ import annotations

import numpy as np

from ... import te
from ...compiler import expr as E
from ..errors import ModelError
from .registry import register, static_shape


def broadcast_shape(*shapes) -> tuple:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not broadcast") \
            from None


def broadcast_index(tensor, out_idx):
    """The element of ``tensor`` that numpy broadcasting pairs with output index ``out_idx``."""
    shape = static_shape(tensor)
    lead = len(out_idx) - len(shape)
    return tensor[tuple(0 if d == 1 else out_idx[lead + k] for k, d in enumerate(shape))] \
        if shape else tensor[()]


def _c(value, dtype):
    return te.const(value, dtype)


def _unary_infer(inputs, attrs):
    return inputs[0].shape, inputs[0].dtype


def _cast_infer(inputs, attrs):
    return inputs[0].shape, attrs["dtype"]


def _predicate_infer(inputs, attrs):
    return inputs[0].shape, "bool"


def _logical_not_infer(inputs, attrs):
    _require_bool(inputs)
    return inputs[0].shape, "bool"


def _unary(name, body, fold, infer=_unary_infer):
    def compute(ts, attrs, node):
        x = ts[0]
        return te.compute(node.shape, lambda *i: body(x[i], attrs, node.dtype), name=name)
    register(name, "elemwise", infer, compute, fold)


def _relu(v, a, dt):
    return E.maximum(v, _c(0, dt))


def _leaky(v, a, dt):
    return E.if_then_else(v >= _c(0, dt), v, v * _c(a["alpha"], dt))


def _clip(v, a, dt):
    out = v
    if a.get("min") is not None:
        out = E.maximum(out, _c(a["min"], dt))
    if a.get("max") is not None:
        out = E.minimum(out, _c(a["max"], dt))
    return out


def _hard_sigmoid(v, a, dt):
    return E.maximum(_c(0, dt), E.minimum(_c(1, dt), v * _c(a["alpha"], dt) + _c(a["beta"], dt)))


def _hard_swish(v, a, dt):
    return v * E.maximum(_c(0, dt), E.minimum(_c(1, dt), v * _c(1 / 6, dt) + _c(0.5, dt)))


def _np_clip(x, a):
    lo = -np.inf if a.get("min") is None else a["min"]
    hi = np.inf if a.get("max") is None else a["max"]
    return np.clip(x, lo, hi).astype(x.dtype)


def _np_hs(x, a):
    return np.clip(x * a["alpha"] + a["beta"], 0, 1).astype(x.dtype)


_unary("relu", _relu, lambda xs, a: np.maximum(xs[0], 0).astype(xs[0].dtype))
_unary("leaky_relu", _leaky, lambda xs, a: np.where(xs[0] >= 0, xs[0], xs[0] * a["alpha"])
       .astype(xs[0].dtype))
_unary("clip", _clip, lambda xs, a: _np_clip(xs[0], a))
_unary("sigmoid", lambda v, a, dt: _c(1, dt) / (_c(1, dt) + te.exp(-v)),
       lambda xs, a: (1 / (1 + np.exp(-xs[0]))).astype(xs[0].dtype))
_unary("tanh", lambda v, a, dt: te.tanh(v), lambda xs, a: np.tanh(xs[0]))
_unary("exp", lambda v, a, dt: te.exp(v), lambda xs, a: np.exp(xs[0]))
_unary("log", lambda v, a, dt: te.log(v), lambda xs, a: np.log(xs[0]))
_unary("sqrt", lambda v, a, dt: te.sqrt(v), lambda xs, a: np.sqrt(xs[0]))
_unary("negative", lambda v, a, dt: -v, lambda xs, a: -xs[0])
_unary("abs", lambda v, a, dt: te.abs(v), lambda xs, a: np.abs(xs[0]))
_unary("floor", lambda v, a, dt: te.floor(v), lambda xs, a: np.floor(xs[0]))
_unary("ceil", lambda v, a, dt: te.ceil(v), lambda xs, a: np.ceil(xs[0]))
_unary("reciprocal", lambda v, a, dt: _c(1, dt) / v, lambda xs, a: 1 / xs[0])
_unary("hard_sigmoid", _hard_sigmoid, lambda xs, a: _np_hs(xs[0], a))
_unary("hard_swish", _hard_swish,
       lambda xs, a: (xs[0] * _np_hs(xs[0], {"alpha": 1 / 6, "beta": 0.5})).astype(xs[0].dtype))
_unary("copy", lambda v, a, dt: v, lambda xs, a: xs[0].copy())
_unary("cast", lambda v, a, dt: E.cast(v, dt), lambda xs, a: xs[0].astype(a["dtype"]),
       _cast_infer)


def _isinf(v, a):
    out = E.call_math("isinf", v)
    if not a["negative"]:
        out = E.logical_and(out, v > _c(0, v.dtype))
    if not a["positive"]:
        out = E.logical_and(out, v < _c(0, v.dtype))
    return out


def _np_isinf(x, a):
    return np.isinf(x) & (a["negative"] | (x > 0)) & (a["positive"] | (x < 0))


_unary("isnan", lambda v, a, dt: E.call_math("isnan", v), lambda xs, a: np.isnan(xs[0]),
       _predicate_infer)
_unary("isinf", lambda v, a, dt: _isinf(v, a), lambda xs, a: _np_isinf(xs[0], a),
       _predicate_infer)
_unary("logical_not", lambda v, a, dt: E.logical_not(v), lambda xs, a: ~xs[0],
       _logical_not_infer)


def _binary_infer(inputs, attrs):
    a, b = inputs
    if a.dtype != b.dtype:
        raise ModelError(f"operands of different dtypes ({a.dtype}, {b.dtype})")
    return broadcast_shape(a.shape, b.shape), a.dtype


def _compare_infer(inputs, attrs):
    return _binary_infer(inputs, attrs)[0], "bool"


def _require_bool(inputs):
    if any(i.dtype != "bool" for i in inputs):
        raise ModelError(f"logical operators take bool operands, got "
                         f"{', '.join(i.dtype for i in inputs)}")


def _logical_infer(inputs, attrs):
    _require_bool(inputs)
    return broadcast_shape(*(i.shape for i in inputs)), "bool"


def _where_infer(inputs, attrs):
    cond, x, y = inputs
    _require_bool([cond])
    if x.dtype != y.dtype:
        raise ModelError(f"where's choices are of different dtypes ({x.dtype}, {y.dtype})")
    return broadcast_shape(cond.shape, x.shape, y.shape), x.dtype


def _broadcasting(name, body, fold, infer):
    """An operator of numpy-broadcast operands: ``body`` of their paired elements."""
    def compute(ts, attrs, node):
        return te.compute(node.shape, lambda *i: body(*(broadcast_index(t, i) for t in ts)),
                          name=name)
    register(name, "broadcast", infer, compute, lambda xs, a: np.asarray(fold(*xs)))


def _binary(name, body, fold):
    _broadcasting(name, body, lambda a, b: np.asarray(fold(a, b)).astype(a.dtype),
                  _binary_infer)


def _int_div(a, b):
    return np.trunc(a / b) if a.dtype.kind == "f" else np.trunc(np.true_divide(a, b)).astype(a.dtype)


_binary("add", lambda x, y: x + y, np.add)
_binary("subtract", lambda x, y: x - y, np.subtract)
_binary("multiply", lambda x, y: x * y, np.multiply)
_binary("divide", lambda x, y: x / y, lambda a, b: a / b if a.dtype.kind == "f" else _int_div(a, b))
_binary("maximum", E.maximum, np.maximum)
_binary("minimum", E.minimum, np.minimum)
for _name, _body, _fold in (("equal", lambda x, y: x == y, np.equal),
                            ("less", lambda x, y: x < y, np.less),
                            ("less_equal", lambda x, y: x <= y, np.less_equal),
                            ("greater", lambda x, y: x > y, np.greater),
                            ("greater_equal", lambda x, y: x >= y, np.greater_equal)):
    _broadcasting(_name, _body, _fold, _compare_infer)
for _name, _body, _fold in (("logical_and", E.logical_and, np.logical_and),
                            ("logical_or", E.logical_or, np.logical_or),
                            ("logical_xor", lambda x, y: x != y, np.logical_xor)):
    _broadcasting(_name, _body, _fold, _logical_infer)
_broadcasting("where", E.if_then_else, np.where, _where_infer)


def _power(x, y):
    if E.is_float(x.dtype):
        return te.power(x, E.cast(y, x.dtype))
    # integer powers through float64 (exact below 2**53), as numpy's integer result
    return E.cast(te.power(E.cast(x, "float64"), E.cast(y, "float64")), x.dtype)


def _power_infer(inputs, attrs):
    return broadcast_shape(inputs[0].shape, inputs[1].shape), inputs[0].dtype


def _power_compute(ts, attrs, node):
    exponent = node.inputs[1]
    if exponent.is_const and exponent.size == 1 and E.is_float(node.dtype):
        # an immediate exponent: the code generator expands x**2, x**-1, x**0.5 ... inline
        c = te.const(float(exponent.value.reshape(-1)[0]), node.dtype)
        return te.compute(node.shape, lambda *i: te.power(broadcast_index(ts[0], i), c),
                          name="power")
    return te.compute(node.shape, lambda *i: _power(
        broadcast_index(ts[0], i), broadcast_index(ts[1], i)), name="power")


register("power", "broadcast", _power_infer, _power_compute,
         lambda xs, a: np.power(xs[0], xs[1]).astype(xs[0].dtype))
