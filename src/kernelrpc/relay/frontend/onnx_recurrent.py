"""ONNX converters of the recurrent layers: LSTM, GRU and RNN.

A layer becomes one dense layer (the input projection of every time step and direction at
once, biases added) and one ``nn.recurrent`` kernel that runs the time loop
(:mod:`..op.recurrent`); its outputs Y, Y_h and Y_c are slices of the kernel's states. The
graph does not grow with the sequence length, which is static (the input's shape).

Weights (W, R, B, P) must be constants; the initial states and ``sequence_lens`` may be run
time inputs (lengths outside ``[0, steps]`` stop the kernel with an error).
"""
from __future__ import annotations

import numpy as np

from .. import ir
from ..errors import ModelError
from ..op.recurrent import ACTIVATION_COUNT, ACTIVATIONS, GATES, STATES, check_bounds
from .onnx_common import Unsupported, converter, reshape

_DEFAULT_ACTIVATIONS = {"lstm": ("Sigmoid", "Tanh", "Tanh"), "gru": ("Sigmoid", "Tanh"),
                        "rnn": ("Tanh",)}

#: activation -> (its alpha, its beta) when the model gives none: the ONNX operator's default,
#: or None where onnxruntime's differs from the specification's (then the model must give
#: the value); absent: the activation takes no such value
_PARAMETERS = {"LeakyRelu": (0.01,), "ThresholdedRelu": (None,), "Elu": (1.0,),
               "HardSigmoid": (0.2, 0.5), "ScaledTanh": (None, None), "Affine": (None, None)}

_DIRECTIONS = {"forward": ("forward",), "reverse": ("reverse",),
               "bidirectional": ("forward", "reverse")}


def _activations(attrs, cell: str, directions: int) -> tuple:
    """Per direction, each activation as ``(name, alpha, beta)``; alphas and betas are taken
    in order by the activations that have them (as onnxruntime reads them)."""
    count = ACTIVATION_COUNT[cell]
    names = attrs.get("activations")
    names = list(_DEFAULT_ACTIVATIONS[cell]) * directions if names is None else \
        [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) != count * directions:
        raise Unsupported(f"activations lists {len(names)} functions; a {cell.upper()} of "
                          f"{directions} direction(s) takes {count * directions}")
    values = [list(attrs.get("activation_alpha") or []), list(attrs.get("activation_beta") or [])]
    given = [len(v) for v in values]
    out = []
    for name in names:
        if name not in ACTIVATIONS:
            raise Unsupported(f"activation {name!r} (supported: {', '.join(ACTIVATIONS)})")
        params = [0.0, 0.0]
        for k, default in enumerate(_PARAMETERS.get(name, ())):
            if values[k]:
                params[k] = float(values[k].pop(0))
            elif default is None:
                raise Unsupported(f"activation {name} without its "
                                  f"{('activation_alpha', 'activation_beta')[k]} value "
                                  "(onnxruntime's default differs from ONNX's)")
            else:
                params[k] = default
        out.append((name, *params))
    for k, left in enumerate(values):
        if left:
            raise Unsupported(f"{('activation_alpha', 'activation_beta')[k]} has {given[k]} "
                              f"values, more than the activations take")
    return tuple(tuple(out[d * count:(d + 1) * count]) for d in range(directions))


def _weights(ctx, node, what, shape):
    value = ctx.constant(node, what)
    if value.shape != shape or value.dtype != np.float32:
        raise Unsupported(f"{what} is {list(value.shape)} {value.dtype}, expected "
                          f"{list(shape)} float32")
    return value


def _lengths(ctx, node, steps, batch):
    if node is None:
        return ir.const(np.full(batch, steps, np.int32), f"{ctx.node_name}.sequence_lens")
    if node.shape != (batch,) or node.dtype != "int32":
        raise Unsupported(f"sequence_lens is {list(node.shape)} {node.dtype}, expected "
                          f"[{batch}] int32")
    if node.is_const and ((node.value < 0) | (node.value > steps)).any():
        raise ModelError(f"sequence_lens {node.value.tolist()} outside [0, {steps}]")
    return node


@converter("LSTM", "GRU", "RNN")
def _recurrent(ctx, args, attrs):
    cell = ctx.op_type.lower()
    args = list(args) + [None] * (8 - len(args))
    x, w, r, bias, lens, h0, c0, peep = args
    direction = attrs.get("direction", "forward")
    if direction not in _DIRECTIONS:
        raise Unsupported(f"direction={direction!r}")
    directions = _DIRECTIONS[direction]
    num_dir = len(directions)
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise Unsupported(f"layout={layout}")
    if len(x.shape) != 3 or x.dtype != "float32":
        raise Unsupported(f"X is {list(x.shape)} {x.dtype}; a 3-D float32 input is supported")
    steps, batch, width_in = (x.shape if layout == 0 else (x.shape[1], x.shape[0], x.shape[2]))
    r_value = ctx.constant(r, "R (the recurrent weights)")
    hidden = int(attrs.get("hidden_size", r_value.shape[-1] if r_value.ndim == 3 else 0))
    try:
        check_bounds(steps, batch, num_dir, hidden)
    except ModelError as exc:
        raise Unsupported(str(exc)) from None
    gates = GATES[cell]
    width = gates * hidden
    w_value = _weights(ctx, w, "W", (num_dir, width, width_in))
    r_value = _weights(ctx, r, "R", (num_dir, width, hidden))
    b_value = np.zeros((num_dir, 2 * width), np.float32) if bias is None else \
        _weights(ctx, bias, "B", (num_dir, 2 * width))
    op_attrs = _layer_attrs(attrs, cell, directions, hidden, layout)
    lbr = op_attrs["linear_before_reset"]
    input_bias, recurrent_bias = b_value[:, :width], b_value[:, width:].copy()
    hidden_gate_bias = recurrent_bias[:, 2 * hidden:].copy()
    if lbr:
        recurrent_bias[:, 2 * hidden:] = 0     # inside the reset gate's product, in the kernel
    proj = _projection(ctx, x, w_value, input_bias + recurrent_bias, layout)
    state_shape = (num_dir, batch, hidden)
    rt = np.ascontiguousarray(r_value.transpose(0, 2, 1))
    inputs = [proj, ir.const(rt, f"{ctx.node_name}.RT"),
              _initial(ctx, h0, "initial_h", layout, state_shape),
              _lengths(ctx, lens, steps, batch)]
    if cell == "lstm":
        inputs.append(_initial(ctx, c0, "initial_c", layout, state_shape))
        if peep is not None:
            inputs.append(ir.const(_weights(ctx, peep, "P", (num_dir, 3 * hidden)),
                                   f"{ctx.node_name}.P"))
    elif lbr:
        inputs.append(ir.const(np.ascontiguousarray(hidden_gate_bias), f"{ctx.node_name}.Rbh"))
    states = ctx.make("nn.recurrent", inputs, **op_attrs, peephole=peep is not None)
    return _outputs(ctx, states, cell, steps, layout)[:ctx.outputs_wanted]


def _layer_attrs(attrs, cell, directions, hidden, layout) -> dict:
    """The ``nn.recurrent`` attributes of the node's attributes."""
    lbr = int(attrs.get("linear_before_reset", 0)) if cell == "gru" else 0
    if lbr not in (0, 1):
        raise Unsupported(f"linear_before_reset={lbr}")
    clip = attrs.get("clip")
    if clip is not None and not float(clip) > 0:
        raise Unsupported(f"clip={clip} (a positive threshold)")
    return {"cell": cell, "directions": directions, "hidden": hidden, "layout": layout,
            "clip": None if clip is None else float(clip),
            "activations": _activations(attrs, cell, len(directions)),
            "linear_before_reset": lbr,
            "input_forget": bool(int(attrs.get("input_forget", 0))) if cell == "lstm" else False}


def _initial(ctx, node, what, layout, shape):
    """An initial state as ``[directions, batch, hidden]`` (``layout`` 1 gives it batch
    first); zeros when absent."""
    if node is None:
        return ir.const(np.zeros(shape, np.float32), f"{ctx.node_name}.{what}")
    expect = shape if layout == 0 else (shape[1], shape[0], shape[2])
    if tuple(node.shape) != expect or node.dtype != "float32":
        raise Unsupported(f"{what} is {list(node.shape)} {node.dtype}, expected {list(expect)} "
                          "float32")
    return node if layout == 0 else ctx.make("transpose", [node], axes=(1, 0, 2))


def _projection(ctx, x, w_value, bias, layout):
    """``X @ W^T + bias`` for every time step and direction as one dense layer:
    ``[T*B, D*G*H]`` (rows ``[B*T]`` with ``layout`` 1)."""
    num_dir, width, width_in = w_value.shape
    flat = reshape(ctx, x, (x.shape[0] * x.shape[1], width_in))
    weight = np.ascontiguousarray(w_value.transpose(2, 0, 1).reshape(width_in, num_dir * width))
    out = ctx.make("nn.dense", [flat, ir.const(weight, f"{ctx.node_name}.W")])
    if bias.any():
        out = ctx.make("add", [out, ir.const(bias.reshape(-1), f"{ctx.node_name}.B")])
    return out


def _outputs(ctx, states, cell, steps, layout):
    """Y, Y_h and Y_c from the kernel's ``[D, B, T + S, H]`` states."""
    def rows(begin, end):
        return ctx.make("strided_slice", [states], slices=((2, begin, end, 1),))

    y = ctx.make("transpose", [rows(0, steps)], axes=(2, 0, 1, 3) if layout == 0 else (1, 2, 0, 3))
    finals = []
    for k in range(STATES[cell]):
        final = rows(steps + k, steps + k + 1)
        final = reshape(ctx, final, final.shape[:2] + final.shape[3:])
        finals.append(final if layout == 0 else ctx.make("transpose", [final], axes=(1, 0, 2)))
    return [y, *finals]
