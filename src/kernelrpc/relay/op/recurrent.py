"""``nn.recurrent``: the time loop of an LSTM, GRU or simple RNN layer, as one kernel.

The input projection ``X @ W^T + bias`` of every time step does not depend on the state, so
the importer computes it beforehand as one dense layer over all steps and directions; this
operator receives it (``proj``) and runs only what is sequential: per time step the small
product of the previous hidden state with the recurrent weights, then the gates.

The kernel is a ``te.extern`` body (a loop over time can hold no ``te.compute`` reduction):
directions and batch rows in a parallel loop, the time steps serial inside. The recurrent
product is written ``for k: acc[:] += h[k] * RT[k, :]`` over the weights transposed to
``[directions, hidden, gates * hidden]``, so its inner loop runs along contiguous rows with no
reduction dependence and vectorizes. The state lives in the output itself (rows ``T`` and
``T + 1``: the last hidden and cell state, which are Y_h and Y_c) and is updated in place once
the step's products are complete; the accumulators live in a second, scratch output.

Inputs: ``proj`` ``[T, B, D, G*H]`` (``[B, T, D, G*H]`` with ``layout`` 1), ``rt``
``[D, H, G*H]``, ``h0`` ``[D, B, H]``, ``lens`` ``[B]`` int32; an LSTM then ``c0``
``[D, B, H]`` and, with ``peephole``, ``[D, 3*H]``; a GRU with ``linear_before_reset`` the
recurrent bias of its hidden gate ``[D, H]``. Output ``[D, B, T + S, H]``: rows ``0..T-1`` the
hidden state of each time step (0 past a sequence's length), then the ``S`` final states.
"""
from __future__ import annotations

from ... import te
from ...compiler import expr as E
from ...compiler.ir import ERR_OUT_OF_BOUNDS, Allocate, AssertStmt, Buffer, Evaluate
from ..errors import ModelError
from .registry import register, static_shape

#: gates per cell, in ONNX's order of the weight rows (LSTM iofc, GRU zrh)
GATES = {"lstm": 4, "gru": 3, "rnn": 1}
#: activations per cell and direction (LSTM f, g, h; GRU f, g; RNN f)
ACTIVATION_COUNT = {"lstm": 3, "gru": 2, "rnn": 1}
#: final states per cell (the hidden state; an LSTM's cell state too)
STATES = {"lstm": 2, "gru": 1, "rnn": 1}

#: the bounds of a layer accepted: time steps, hidden size, and the elements of the states
#: over time (``directions * batch * (steps + 2) * hidden``)
MAX_STEPS = 1 << 16
MAX_HIDDEN = 4096
MAX_STATE_ELEMENTS = 1 << 27
#: accumulators of the recurrent product held in registers at once (4 AVX2 or 8 NEON vectors)
TILE = 32
#: units of the hidden state updated per vector
LANES = 8


def _c(value):
    return te.const(value, "float32")


def _softplus(v):
    return E.maximum(v, _c(0)) + te.log1p(te.exp(-te.abs(v)))


#: ONNX's activation names -> the function of (value, alpha, beta)
ACTIVATIONS = {
    "Sigmoid": lambda v, a, b: _c(1) / (_c(1) + te.exp(-v)),
    "Tanh": lambda v, a, b: te.tanh(v),
    "Relu": lambda v, a, b: E.maximum(v, _c(0)),
    "LeakyRelu": lambda v, a, b: E.if_then_else(v >= _c(0), v, v * _c(a)),
    "ThresholdedRelu": lambda v, a, b: E.if_then_else(v > _c(a), v, _c(0)),
    "ScaledTanh": lambda v, a, b: _c(a) * te.tanh(v * _c(b)),
    "HardSigmoid": lambda v, a, b: E.maximum(_c(0), E.minimum(_c(1), v * _c(a) + _c(b))),
    "Affine": lambda v, a, b: v * _c(a) + _c(b),
    "Elu": lambda v, a, b: E.if_then_else(v >= _c(0), v, _c(a) * (te.exp(v) - _c(1))),
    "Softsign": lambda v, a, b: v / (_c(1) + te.abs(v)),
    "Softplus": lambda v, a, b: _softplus(v),
}


def _infer(inputs, attrs):
    cell, directions, hidden = attrs["cell"], len(attrs["directions"]), attrs["hidden"]
    proj, rt, h0, lens = inputs[:4]
    extra = {"lstm": 1 + bool(attrs["peephole"]),
             "gru": int(attrs["linear_before_reset"]), "rnn": 0}[cell]
    if len(inputs) != 4 + extra:
        raise ModelError(f"nn.recurrent ({cell}) takes {4 + extra} inputs, got {len(inputs)}")
    if len(proj.shape) != 4:
        raise ModelError(f"nn.recurrent: the projection is {list(proj.shape)}, not 4-D")
    steps, batch = (proj.shape[0], proj.shape[1]) if attrs["layout"] == 0 else \
        (proj.shape[1], proj.shape[0])
    width = GATES[cell] * hidden
    expect = [(proj, (*proj.shape[:2], directions, width)), (rt, (directions, hidden, width)),
              (h0, (directions, batch, hidden)), (lens, (batch,))]
    if cell == "lstm":
        expect.append((inputs[4], (directions, batch, hidden)))
    if extra > (cell == "lstm"):
        expect.append((inputs[-1], (directions, (3 if cell == "lstm" else 1) * hidden)))
    for node, shape in expect:
        if tuple(node.shape) != shape:
            raise ModelError(f"nn.recurrent: an input is {list(node.shape)}, expected "
                             f"{list(shape)}")
        if node.dtype != ("int32" if node is lens else "float32"):
            raise ModelError(f"nn.recurrent: an input of dtype {node.dtype}")
    check_bounds(steps, batch, directions, hidden)
    return (directions, batch, steps + STATES[cell], hidden), "float32"


def check_bounds(steps: int, batch: int, directions: int, hidden: int) -> None:
    """The layer's sizes within what the kernel is built for (one kernel whatever the length,
    its states over time in one workspace)."""
    if not 1 <= steps <= MAX_STEPS:
        raise ModelError(f"a recurrent layer of {steps} time steps (1 to {MAX_STEPS} are "
                         "supported)")
    if not 1 <= hidden <= MAX_HIDDEN:
        raise ModelError(f"a recurrent layer of hidden size {hidden} (1 to {MAX_HIDDEN} are "
                         "supported)")
    elements = directions * batch * (steps + 2) * hidden
    if batch < 1 or elements > MAX_STATE_ELEMENTS:
        raise ModelError(f"a recurrent layer of batch {batch}, {steps} steps, hidden size "
                         f"{hidden}: its states over time ({elements} values) exceed "
                         f"{MAX_STATE_ELEMENTS}")


class _Step:
    """The statements of one layer's kernel, built with the IR builder."""

    def __init__(self, ib, ins, outs, attrs):
        self.ib, self.attrs = ib, attrs
        self.cell, self.hidden = attrs["cell"], attrs["hidden"]
        self.width = GATES[self.cell] * self.hidden
        self.proj, self.rt, self.h0, self.lens = (ib.buffer_ptr(b) for b in ins[:4])
        self.extra = [ib.buffer_ptr(b) for b in ins[4:]]
        self.out, self.acc = ib.buffer_ptr(outs[0]), ib.buffer_ptr(outs[1])
        self.steps = static_shape(outs[0])[2] - STATES[self.cell]
        self.batch = static_shape(outs[0])[1]

    def act(self, d, which: int, value):
        """Activation ``which`` (f, g, h) of direction ``d``; ``clip`` bounds its input, except
        an LSTM's h (of the cell state)."""
        clip = self.attrs["clip"]
        if clip is not None and not (self.cell == "lstm" and which == 2):
            value = E.maximum(_c(-clip), E.minimum(_c(clip), value))
        per_direction = [ACTIVATIONS[n](value, a, b) for n, a, b in
                         (acts[which] for acts in self.attrs["activations"])]
        return per_direction[0] if len(per_direction) == 1 else \
            E.if_then_else(d == 0, per_direction[0], per_direction[1])

    def gate_input(self, d, b, t, gate, j):
        """The projected input of ``gate`` at unit ``j`` plus the recurrent product."""
        p_index = (t, b, d, gate * self.hidden + j) if self.attrs["layout"] == 0 else \
            (b, t, d, gate * self.hidden + j)
        return self.proj[p_index] + self.acc[d, b, gate, j]

    def matvec(self, d, b, first_gate: int, gates: int, state_row: int):
        """``acc[gates] = state @ RT[:, gates]``, the state read from ``out`` row
        ``state_row`` or, with -1, the scratch row after the gates (GRU's r * h): in blocks
        of ``TILE`` accumulators kept in vector registers over the whole state."""
        ib, h = self.ib, self.hidden
        lo, n = first_gate * h, gates * h
        base = ib.let("base", ((d * self.batch + b) * (GATES[self.cell] + 1)) * h + lo)

        def state(k):
            return self.out[d, b, state_row, k] if state_row >= 0 else \
                self.acc[d, b, GATES[self.cell], k]
        if n >= TILE:
            with ib.for_range(0, n // TILE, name="blk") as blk:
                self._tile(d, base, lo, blk * TILE, TILE, state)
        if n % TILE:
            self._tile(d, base, lo, n - n % TILE, n % TILE, state)

    def _tile(self, d, base, lo, start, width, state):
        tile = Buffer("acc_tile", (width,), "float32")
        sub = te.ir_builder.create()
        t, flat = sub.buffer_ptr(tile), sub.buffer_ptr(self.acc.buffer)
        with sub.for_range(0, width, name="v", kind="vectorize") as v:
            t[v] = _c(0)
        with sub.for_range(0, self.hidden, name="k") as k:
            hk = sub.let("hk", state(k))
            with sub.for_range(0, width, name="v", kind="vectorize") as v:
                t[v] = t[v] + hk * self.rt[d, k, lo + start + v]
        with sub.for_range(0, width, name="v", kind="vectorize") as v:
            flat[base + start + v] = t[v]
        self.ib.emit(Allocate(tile, sub.get()))

    def units(self, body):
        """``body(j)`` for every unit ``j`` of the hidden state, in vectors of ``LANES``."""
        ib, h = self.ib, self.hidden
        if h >= LANES:
            with ib.for_range(0, h // LANES, name="jo") as jo:
                with ib.for_range(0, LANES, name="ji", kind="vectorize") as ji:
                    body(jo * LANES + ji)
        if h % LANES:
            with ib.for_range(h - h % LANES, h, name="j", kind="vectorize") as j:
                body(j)

    def step(self, d, b, t):
        """One time step at time ``t``: the state rows of ``out`` updated in place."""
        T = self.steps
        getattr(self, f"_{self.cell}")(d, b, t)

        def record(j):
            self.out[d, b, t, j] = self.out[d, b, T, j]
        self.units(record)

    def _rnn(self, d, b, t):
        T = self.steps
        self.matvec(d, b, 0, 1, T)

        def update(j):
            self.out[d, b, T, j] = self.act(d, 0, self.gate_input(d, b, t, 0, j))
        self.units(update)

    def _lstm(self, d, b, t):
        ib, T, h = self.ib, self.steps, self.hidden
        self.matvec(d, b, 0, 4, T)
        peep = self.extra[1] if self.attrs["peephole"] else None

        def update(j):
            c_prev = ib.let("c_prev", self.out[d, b, T + 1, j])

            def gate(g, c, peep_row):
                pre = self.gate_input(d, b, t, g, j)
                if peep is not None:
                    pre = pre + peep[d, peep_row * h + j] * c
                return self.act(d, 0, pre)
            i = ib.let("i", gate(0, c_prev, 0))
            f = _c(1) - i if self.attrs["input_forget"] else gate(2, c_prev, 2)
            cand = self.act(d, 1, self.gate_input(d, b, t, 3, j))
            c = ib.let("c", f * c_prev + i * cand)
            self.out[d, b, T + 1, j] = c
            self.out[d, b, T, j] = gate(1, c, 1) * self.act(d, 2, c)
        self.units(update)

    def _gru(self, d, b, t):
        ib, T, h = self.ib, self.steps, self.hidden
        lbr = self.attrs["linear_before_reset"]
        self.matvec(d, b, 0, 3 if lbr else 2, T)

        def reset(j):
            return self.act(d, 0, self.gate_input(d, b, t, 1, j))
        if not lbr:
            def reset_state(j):
                self.acc[d, b, 3, j] = reset(j) * self.out[d, b, T, j]
            self.units(reset_state)
            self.matvec(d, b, 2, 1, -1)

        def update(j):
            if lbr:
                p_index = (t, b, d, 2 * h + j) if self.attrs["layout"] == 0 else \
                    (b, t, d, 2 * h + j)
                pre = self.proj[p_index] + reset(j) * (self.acc[d, b, 2, j] + self.extra[0][d, j])
            else:
                pre = self.gate_input(d, b, t, 2, j)
            cand = self.act(d, 1, pre)
            z = ib.let("z", self.act(d, 0, self.gate_input(d, b, t, 0, j)))
            self.out[d, b, T, j] = (_c(1) - z) * cand + z * self.out[d, b, T, j]
        self.units(update)


def _body(ins, outs, attrs):
    ib = te.ir_builder.create()
    step = _Step(ib, ins, outs, attrs)
    T, B = step.steps, step.batch
    lens = step.lens
    with ib.for_range(0, B, name="b") as b:
        ib.emit(AssertStmt(E.all_of(lens[b] >= 0, lens[b] <= T),
                           f"sequence_lens must be in [0, {T}] (the time steps)",
                           ERR_OUT_OF_BOUNDS, Evaluate(E.convert(0))))
    directions = attrs["directions"]
    with ib.for_range(0, len(directions) * B, name="db", kind="parallel") as db:
        d, b = E.floordiv(db, B), E.floormod(db, B)

        def initial(j):
            step.out[d, b, T, j] = step.h0[d, b, j]
            if step.cell == "lstm":
                step.out[d, b, T + 1, j] = step.extra[0][d, b, j]
        step.units(initial)
        n = ib.let("n", lens[b])
        with ib.for_range(0, T, name="s") as s:
            with ib.if_scope(s < n):
                if directions == ("forward",):
                    t = s
                elif directions == ("reverse",):
                    t = n - 1 - s
                else:
                    t = E.if_then_else(d == 0, s, n - 1 - s)
                step.step(d, b, ib.let("t", t))
            with ib.else_scope():
                def clear(j):
                    step.out[d, b, s, j] = _c(0)
                step.units(clear)
        with ib.if_scope(n == 0):      # an empty sequence's final states are 0 (onnxruntime's)
            def clear_final(j):
                for row in range(STATES[step.cell]):
                    step.out[d, b, T + row, j] = _c(0)
            step.units(clear_final)
    return ib.get()


def _compute(ts, attrs, node):
    directions, batch, rows, hidden = node.shape
    gates = GATES[attrs["cell"]]
    states, _ = te.extern([list(node.shape), [directions, batch, gates + 1, hidden]], ts,
                          lambda ins, outs: _body(ins, outs, attrs), name="recurrent",
                          dtype=["float32", "float32"])
    # the group's output stage: the states without the scratch, as a compute the
    # schedule can parallelize
    return te.compute(node.shape, lambda *i: states[i], name="recurrent_out")


def _flops(node):
    directions, batch, _, hidden = node.shape
    steps = node.inputs[0].shape[0 if node.attrs["layout"] == 0 else 1]
    return 2 * directions * batch * steps * hidden * GATES[node.attrs["cell"]] * hidden


register("nn.recurrent", "opaque", _infer, _compute, flops=_flops)

__all__ = ["ACTIVATIONS", "ACTIVATION_COUNT", "GATES", "MAX_HIDDEN", "MAX_STATE_ELEMENTS",
           "MAX_STEPS", "STATES", "check_bounds"]
