"""``nn.recurrent``: the time loop of an LSTM, GRU or simple RNN layer, as one kernel.

The input projection ``X @ W^T + bias`` of every time step does not depend on the state, so
the importer computes it beforehand as one dense layer over all steps and directions; this
operator receives it (``proj``) and runs only what is sequential: per time step the small
product of the previous hidden state with the recurrent weights, then the gates.

Why a loop and not the layer unrolled over time into existing operators (as TVM's ONNX
frontend does): unrolled, the graph, the build and the number of kernel calls grow with the
sequence length, and every step's few small kernels would each go through memory; here the
graph is the same for 10 steps or 10,000 and a step costs no call.

The kernel is a ``te.extern`` body (a loop over time can hold no ``te.compute`` reduction).
Its parallel tasks are the directions times groups of up to ``GROUP`` batch rows; the time
steps run serially inside. The recurrent product is written ``for k: acc[:] += h[k] *
RT[k, :]`` over the weights transposed to ``[directions, hidden, gates * hidden]``: a tile of
``TILE`` accumulators (over the group's rows) stays in vector registers for the whole state,
each load of the weights serving every row of the group; the gates are computed in vectors of
``LANES`` units. The state lives in the output itself (rows ``T`` and ``T + 1``: the last
hidden and cell state, which are Y_h and Y_c) and is updated in place once the step's products
are complete; the products live in a second, scratch output.

Inputs: ``proj`` ``[T*B, D*G*H]`` (rows ``[B*T]`` with ``layout`` 1), ``rt``
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
from .activation import _softplus as softplus
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
#: accumulators of the recurrent product held in registers at once, over a group's batch rows
#: (8 AVX2 or 16 NEON vectors)
TILE = 64
#: units of the hidden state updated per vector
LANES = 8
#: most batch rows whose recurrent products share a load of the weights
GROUP = 4


def _c(value):
    return te.const(value, "float32")


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
    "Softplus": lambda v, a, b: softplus(v, "float32"),
}


def _infer(inputs, attrs):
    cell, directions, hidden = attrs["cell"], len(attrs["directions"]), attrs["hidden"]
    proj, rt, h0, lens = inputs[:4]
    extra = {"lstm": 1 + bool(attrs["peephole"]),
             "gru": int(attrs["linear_before_reset"]), "rnn": 0}[cell]
    if len(inputs) != 4 + extra:
        raise ModelError(f"nn.recurrent ({cell}) takes {4 + extra} inputs, got {len(inputs)}")
    batch = lens.shape[0] if len(lens.shape) == 1 else 0
    if len(proj.shape) != 2 or not batch or proj.shape[0] % batch:
        raise ModelError(f"nn.recurrent: the projection is {list(proj.shape)}, not 2-D with "
                         f"rows of {list(lens.shape)} batch rows")
    steps = proj.shape[0] // batch
    width = GATES[cell] * hidden
    expect = [(proj, (steps * batch, directions * width)), (rt, (directions, hidden, width)),
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


class _Kernel:
    """The statements of one layer's kernel, built with the IR builder.

    A task runs one direction for a group of batch rows (``group`` of them, sharing each
    load of the recurrent weights); a time step is a list of phases, each either a product
    with the recurrent weights for every row of the group or an update of the units of each
    row still inside its sequence.
    """

    def __init__(self, ib, ins, outs, attrs):
        self.ib, self.attrs = ib, attrs
        self.cell, self.hidden = attrs["cell"], attrs["hidden"]
        self.proj, self.rt, self.h0, self.lens = (ib.buffer_ptr(b) for b in ins[:4])
        self.extra = [ib.buffer_ptr(b) for b in ins[4:]]
        self.out, self.acc = ib.buffer_ptr(outs[0]), ib.buffer_ptr(outs[1])
        self.steps = static_shape(outs[0])[2] - STATES[self.cell]
        self.batch = static_shape(outs[0])[1]
        self.group = max(g for g in range(GROUP, 0, -1) if self.batch % g == 0)
        self.tile_width = 1 << (TILE // self.group).bit_length() - 1

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

    def projected(self, d, b, t, gate, j):
        row = t * self.batch + b if self.attrs["layout"] == 0 else b * self.steps + t
        width = GATES[self.cell] * self.hidden
        return self.proj[row, d * width + gate * self.hidden + j]

    def gate_input(self, d, b, t, gate, j):
        """The projected input of ``gate`` at unit ``j`` plus the recurrent product."""
        return self.projected(d, b, t, gate, j) + self.acc[d, b, gate, j]

    # ------------------------------------------------------------ the recurrent product

    def product(self, d, b0, first_gate: int, gates: int, from_scratch: bool):
        """``acc[b, gates] = state[b] @ RT[:, gates]`` for the group's rows ``b``, the state
        the hidden state or (``from_scratch``) the scratch row after the gates (GRU's r * h):
        in tiles of ``TILE`` accumulators over the rows, kept in vector registers over the state."""
        ib, h = self.ib, self.hidden
        lo, n, width = first_gate * h, gates * h, self.tile_width
        if n >= width:
            with ib.for_range(0, n // width, name="blk") as blk:
                self._tile(d, b0, lo + blk * width, width, from_scratch)
        if n % width:
            self._tile(d, b0, lo + n - n % width, n % width, from_scratch)

    def _tile(self, d, b0, start, width, from_scratch):
        rows, h, state_row = self.group, self.hidden, GATES[self.cell]
        tile = Buffer("acc_tile", (rows * width,), "float32")
        sub = te.ir_builder.create()
        t, acc = sub.buffer_ptr(tile), sub.buffer_ptr(self.acc.buffer)
        with sub.for_range(0, rows * width, name="v", kind="vectorize") as v:
            t[v] = _c(0)
        with sub.for_range(0, h, name="k") as k:
            for r in range(rows):
                b = b0 + r
                hk = self.acc[d, b, state_row, k] if from_scratch else \
                    self.out[d, b, self.steps, k]
                with sub.for_range(0, width, name="v", kind="vectorize") as v:
                    t[r * width + v] = t[r * width + v] + hk * self.rt[d, k, start + v]
        for r in range(rows):
            base = ((d * self.batch + b0 + r) * (state_row + 1)) * h + start
            with sub.for_range(0, width, name="v", kind="vectorize") as v:
                acc[base + v] = t[r * width + v]
        self.ib.emit(Allocate(tile, sub.get()))

    # ------------------------------------------------------------ the units

    def units(self, body):
        """``body(j)`` for every unit ``j`` of the hidden state, in vectors of ``LANES``."""
        ib, h = self.ib, self.hidden
        if h >= LANES:
            with ib.for_range(0, h // LANES, name="jo") as jo, \
                    ib.for_range(0, LANES, name="ji", kind="vectorize") as ji:
                body(jo * LANES + ji)
        if h % LANES:
            with ib.for_range(h - h % LANES, h, name="j", kind="vectorize") as j:
                body(j)

    def phases(self):
        """The time step of each cell: ("product", first gate, gates, from scratch) or
        ("units", update(d, b, t, j))."""
        T = self.steps
        if self.cell == "rnn":
            def rnn(d, b, t, j):
                self.out[d, b, T, j] = self.act(d, 0, self.gate_input(d, b, t, 0, j))
            return [("product", 0, 1, False), ("units", rnn)]
        if self.cell == "lstm":
            return [("product", 0, 4, False), ("units", self._lstm)]
        if self.attrs["linear_before_reset"]:
            return [("product", 0, 3, False), ("units", self._gru)]

        def reset_state(d, b, t, j):
            self.acc[d, b, 3, j] = self._reset(d, b, t, j) * self.out[d, b, T, j]
        return [("product", 0, 2, False), ("units", reset_state), ("product", 2, 1, True),
                ("units", self._gru)]

    def _lstm(self, d, b, t, j):
        ib, T, h = self.ib, self.steps, self.hidden
        peep = self.extra[1] if self.attrs["peephole"] else None
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

    def _reset(self, d, b, t, j):
        return self.act(d, 0, self.gate_input(d, b, t, 1, j))

    def _gru(self, d, b, t, j):
        ib, T = self.ib, self.steps
        if self.attrs["linear_before_reset"]:
            pre = self.projected(d, b, t, 2, j) + self._reset(d, b, t, j) * (
                self.acc[d, b, 2, j] + self.extra[0][d, j])
        else:
            pre = self.gate_input(d, b, t, 2, j)
        cand = self.act(d, 1, pre)
        z = ib.let("z", self.act(d, 0, self.gate_input(d, b, t, 0, j)))
        self.out[d, b, T, j] = (_c(1) - z) * cand + z * self.out[d, b, T, j]

    # ------------------------------------------------------------ the whole layer

    def time_of(self, d, s, n):
        """The time step a direction is at after ``s`` steps of a sequence of ``n``."""
        directions = self.attrs["directions"]
        if directions == ("forward",):
            return s
        if directions == ("reverse",):
            return n - 1 - s
        return E.if_then_else(d == 0, s, n - 1 - s)

    def each_row(self, b0, body):
        """``body(b, n)`` for each batch row of the group, ``n`` its sequence length."""
        with self.ib.for_range(0, self.group, name="r") as r:
            body(b0 + r, self.ib.let("n", self.lens[b0 + r]))

    def run(self, d, b0):
        ib, T = self.ib, self.steps

        def initial(b, n):
            def copy(j):
                self.out[d, b, T, j] = self.h0[d, b, j]
                if self.cell == "lstm":
                    self.out[d, b, T + 1, j] = self.extra[0][d, b, j]
            self.units(copy)
        self.each_row(b0, initial)
        phases = self.phases()
        with ib.for_range(0, T, name="s") as s:
            for k, phase in enumerate(phases):
                if phase[0] == "product":
                    self.product(d, b0, *phase[1:])
                    continue
                last = k == len(phases) - 1

                def update(b, n, update=phase[1], last=last):
                    with ib.if_scope(s < n):
                        t = ib.let("t", self.time_of(d, s, n))
                        self.units(lambda j: update(d, b, t, j))
                        if last:
                            self.units(lambda j: self.out.__setitem__(
                                (d, b, t, j), self.out[d, b, T, j]))
                    if last:
                        with ib.else_scope():
                            self.units(lambda j: self.out.__setitem__((d, b, s, j), _c(0)))
                self.each_row(b0, update)

        def empty(b, n):       # an empty sequence's final states are 0 (onnxruntime's)
            with ib.if_scope(n == 0):
                for row in range(STATES[self.cell]):
                    self.units(lambda j, row=row: self.out.__setitem__((d, b, T + row, j), _c(0)))
        self.each_row(b0, empty)


def _body(ins, outs, attrs):
    ib = te.ir_builder.create()
    kernel = _Kernel(ib, ins, outs, attrs)
    T, B, lens = kernel.steps, kernel.batch, kernel.lens
    with ib.for_range(0, B, name="b") as b:
        ib.emit(AssertStmt(E.all_of(lens[b] >= 0, lens[b] <= T),
                           f"sequence_lens must be in [0, {T}] (the time steps)",
                           ERR_OUT_OF_BOUNDS, Evaluate(E.convert(0))))
    groups = B // kernel.group
    with ib.for_range(0, len(attrs["directions"]) * groups, name="task", kind="parallel") as task:
        kernel.run(E.floordiv(task, groups), E.floormod(task, groups) * kernel.group)
    return ib.get()


def _compute(ts, attrs, node):
    directions, batch, _, hidden = node.shape
    gates = GATES[attrs["cell"]]
    states, _ = te.extern([list(node.shape), [directions, batch, gates + 1, hidden]], ts,
                          lambda ins, outs: _body(ins, outs, attrs), name="recurrent",
                          dtype=["float32", "float32"])
    # the group's output stage: the states without the scratch, as a compute the
    # schedule can parallelize
    return te.compute(node.shape, lambda *i: states[i], name="recurrent_out")


def _flops(node):
    directions, batch, rows, hidden = node.shape
    steps = rows - STATES[node.attrs["cell"]]
    return 2 * directions * batch * steps * hidden * GATES[node.attrs["cell"]] * hidden


register("nn.recurrent", "opaque", _infer, _compute, flops=_flops)

__all__ = ["ACTIVATIONS", "ACTIVATION_COUNT", "GATES", "MAX_HIDDEN", "MAX_STATE_ELEMENTS",
           "MAX_STEPS", "STATES", "check_bounds"]
