"""ScheduleOps: turn a schedule into one loop nest over flat buffers.

Steps, as in TVM: inline ``compute_inline`` stages into their readers, infer the
region each ``compute_at`` stage must produce (consumers first), derive every leaf
loop's extent and every root index from the split/fuse relations, guard indices
that a non-dividing split can push past their extent, and emit the nests with
attached stages (and their buffers) placed inside their parent's loops.
"""
from __future__ import annotations

from ..expr import (PrimExpr, Var, all_of, any_of, convert, dtype_bits, floormod, maximum,
                    minimum)
from ..ir import (Allocate, Buffer, BufferPointer, For, IfThenElse, LetStmt, Load, Mutator,
                  Prefetch, PrimFunc,
                  Store, post_order_visit, seq, substitute, vars_in)
from ..schedule import Fuse, Schedule, Split, replace_tensor
from ..tensor import (ComputeOp, ExternOp, IterVar, PlaceholderOp, Reduce, ScanOp, Tensor,
                      TensorLoad)
from .arith import INF, bound, const_int, from_linear, linear, simplify


class LowerError(ValueError):
    """The schedule cannot be lowered (bad arguments, invalid attachment)."""


class _StageInfo:
    """Loop structure of one stage after bounds inference."""

    def __init__(self, stage, bodies):
        self.stage = stage
        self.bodies = bodies             # compute bodies (one per output), producers inlined
        self.root_dom: dict = {}         # root IterVar -> (min expr, extent expr)
        self.ext: dict = {}              # every IterVar -> extent expr
        self.rel: dict = {}              # IterVar -> value relative to its min, in leaf vars
        self.checks: list = []           # conditions that keep indices inside their extent
        self.partial: set = set()        # root axes computed over a sub-region (compute_at)
        self.buffers: dict = {}          # output value_index -> Buffer
        self.offsets: tuple = ()         # region min per dim for attached buffers
        self.children: dict = {}         # leaf position -> [child _StageInfo]

    @property
    def body(self):
        return self.bodies[0]

    @property
    def buffer(self) -> Buffer | None:
        return self.buffers.get(0)

    @property
    def leaves(self):
        return self.stage.leaf_iter_vars

    def root_value(self, iv: IterVar) -> PrimExpr:
        lo = self.root_dom[iv][0]
        return simplify(lo + self.rel[iv])

    def leaf_ranges(self) -> dict:
        out = {}
        for leaf in self.leaves:
            n = const_int(self.ext[leaf])
            if n is not None:
                out[leaf.var] = (0, n - 1)
        return out


class _Inliner(Mutator):
    def __init__(self, sch: Schedule, bodies: dict):
        self.sch, self.bodies = sch, bodies

    def visit_TensorLoad(self, node):
        indices = tuple(self.visit(i) for i in node.indices)
        stage = self.sch.stage_map.get(node.tensor.op)
        if stage is not None and stage.attach_type == "inline":
            axis = stage.op.axis
            body = self.bodies[stage][node.tensor.value_index]
            return substitute(body, {iv.var: i for iv, i in zip(axis, indices)})
        return TensorLoad(node.tensor, indices)


def _loads_of(bodies, stage, sch) -> list:
    found = []

    def fn(node):
        if isinstance(node, TensorLoad) and sch.stage_map.get(node.tensor.op) is stage:
            found.append(node)
    for body in bodies:
        post_order_visit(body, fn)
    return found


class ScheduleLowering:
    def __init__(self, sch: Schedule, args):
        self.sch = sch
        self.args = list(args)
        self.infos: dict = {}
        self.buffers: dict = {}          # stage -> Buffer
        self.names: set = set()

    # ------------------------------------------------------------------ entry
    def run(self, name: str) -> PrimFunc:
        sch = self.sch
        bodies: dict = {}
        inliner = _Inliner(sch, bodies)
        for stage in sch.stages:
            if isinstance(stage.op, ComputeOp):
                bodies[stage] = tuple(inliner.visit(b) for b in stage.op.bodies)
                if stage.attach_type == "inline" and stage.op in sch.outputs:
                    raise LowerError(f"output {stage.op.name} cannot be inlined")
        computes = [s for s in sch.stages if isinstance(s.op, (ExternOp, ScanOp))
                    or (isinstance(s.op, ComputeOp) and s.attach_type != "inline")]
        for stage in computes:
            self.infos[stage] = _StageInfo(stage, bodies.get(stage, ()))
        params = self._params()
        for stage in reversed(computes):
            if isinstance(stage.op, (ExternOp, ScanOp)):
                self._check_extern_inputs(stage)
                continue
            self._infer_bound(self.infos[stage], computes)
            self._derive_loops(self.infos[stage])
        roots, allocs = [], []
        for stage in computes:
            info = self.infos[stage]
            if stage.attach_type == "scope":
                parent = self.infos.get(stage.attach_stage)
                pos = self._leaf_pos(parent, stage)
                parent.children.setdefault(pos, []).append(info)
            else:
                roots.append(info)
            if len(info.buffers) < len(stage.op.outputs):
                shape = self._alloc_shape(info)
                if stage.rolling:
                    self._roll(info)
                for out in stage.op.outputs:
                    if out.value_index in info.buffers:
                        continue
                    own = out.shape if isinstance(stage.op, (ExternOp, ScanOp)) else shape
                    buf = self._new_buffer(out.name, own, out.dtype, stage.scope,
                                           stage.storage_aligns)
                    info.buffers[out.value_index] = buf
                    if stage.attach_type != "scope":
                        allocs.append(buf)
        body = seq(*[self._build(info) for info in roots])
        for buf in reversed(allocs):
            body = Allocate(buf, body)
        return PrimFunc(name, params, body, {"global_symbol": name, "tir.noalias": True})

    # ------------------------------------------------------------------ buffers
    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self.names:
            name = f"{base}_{k}"
            k += 1
        self.names.add(name)
        return name

    def _new_buffer(self, name, shape, dtype, scope="global", aligns=None) -> Buffer:
        buf = Buffer(self._unique(name), shape, dtype, scope, _aligned_strides(shape, aligns))
        size = const_int(convert(buf.size))
        if size is not None and size >= 2 ** 31:
            raise LowerError(f"{name} has {size} elements; indices are int32 (max 2**31 - 1)")
        return buf

    def _params(self) -> list:
        params, seen = [], set()
        for arg in self.args:
            if isinstance(arg, Var):
                params.append(arg)
                continue
            if not isinstance(arg, Tensor):
                raise LowerError(f"lower: arguments must be tensors or te.var, got {arg!r}")
            stage = self.sch.stage_map.get(arg.op)
            key = stage if stage is not None else arg.op
            if (id(key), arg.value_index) in seen:
                raise LowerError(f"lower: tensor {arg.name} is given twice")
            seen.add((id(key), arg.value_index))
            if stage is not None and stage.attach_type == "inline":
                raise LowerError(f"lower: {arg.name} is inlined and has no buffer")
            buf = self._new_buffer(arg.name, arg.shape, arg.dtype)
            self.buffers[key] = buf
            if stage is not None and stage in self.infos:
                info = self.infos[stage]
                if stage.storage_aligns:
                    raise LowerError(f"lower: storage_align pads buffers lowering allocates; "
                                     f"{arg.name} is a function argument")
                if info.buffers and info.offsets != (0,) * len(arg.shape):
                    raise LowerError(f"lower: {arg.name} is attached (compute_at)")
                info.buffers[arg.value_index] = buf
                info.offsets = (0,) * len(arg.shape)
            params.append(buf)
        for stage in self.sch.stages:
            if isinstance(stage.op, PlaceholderOp) and stage not in self.buffers:
                extern_use = any(isinstance(s.op, ExternOp) and any(t.op is stage.op
                                                                   for t in s.op.inputs)
                                 for s in self.sch.stages)
                if extern_use or any(_loads_of(info.bodies, stage, self.sch)
                                     for info in self.infos.values()):
                    raise LowerError(f"lower: placeholder {stage.op.name} is used but not in args")
        free = []
        for arg_buf in [p for p in params if isinstance(p, Buffer)]:
            for dim in arg_buf.shape:
                post_order_visit(dim, lambda n: free.append(n) if isinstance(n, Var) else None)
        for v in free:
            if all(v is not p for p in params):
                params.append(v)
        return params

    def _check_extern_inputs(self, stage) -> None:
        for t in stage.op.input_tensors:
            producer = self.sch.stage_map.get(t.op)
            if producer is not None and producer.attach_type != "root" \
                    and isinstance(producer.op, ComputeOp):
                raise LowerError(f"extern {stage.op.name} reads {t.name}, which is "
                                 f"{producer.attach_type}d: externs need their inputs whole")

    def _alloc_shape(self, info) -> tuple:
        if isinstance(info.stage.op, (ExternOp, ScanOp)):
            info.offsets = (0,) * len(info.stage.op.outputs[0].shape)
            return info.stage.op.outputs[0].shape
        shape = []
        for iv in info.stage.op.axis:
            shape.append(info.root_dom[iv][1])
        if info.stage.attach_type == "scope":
            info.offsets = tuple(info.root_dom[iv][0] for iv in info.stage.op.axis)
        else:
            info.offsets = (0,) * len(shape)
        return tuple(shape)

    def _roll(self, info) -> None:
        """rolling_buffer: make ``info``'s buffer circular along the axis its region slides on
        in its parent's loop, and guard its stores to the part the previous iteration did not
        compute (see Stage.rolling_buffer)."""
        stage = info.stage
        name = f"rolling_buffer of {stage.op.name}"
        if stage.attach_type != "scope":
            raise LowerError(f"{name}: the stage must be computed at a loop (compute_at)")
        if stage.tensorized is not None:
            raise LowerError(f"{name}: a tensorized stage cannot roll")
        parent = self.infos.get(stage.attach_stage)
        pos = self._leaf_pos(parent, stage)
        loop = parent.leaves[pos]
        kind = self._kind(parent.stage, loop)
        if kind not in ("serial", "unrolled"):
            raise LowerError(f"{name}: {parent.stage.op.name}'s loop {loop.var.name} is {kind}; a "
                             "rolling buffer needs its iterations in order")
        v = loop.var
        moving = []
        for d, iv in enumerate(stage.op.axis):
            lo, extent = info.root_dom[iv]
            previous = substitute(lo, {v: v - 1})
            step = const_int(simplify(convert(lo) - previous))
            if step is None or step < 0:
                raise LowerError(f"{name}: its region along {iv.var.name} does not move forward by a "
                                 f"constant step per iteration of {loop.var.name} (starts at {lo})")
            if step:
                moving.append((d, iv, previous, extent))
        if len(moving) > 1:
            raise LowerError(f"{name}: its region slides along several axes "
                             f"({', '.join(m[1].var.name for m in moving)}); it may roll along one")
        first = convert(v) == 0
        if moving:
            d, iv, previous, extent = moving[0]
            offsets = list(info.offsets)
            offsets[d] = _Circular()
            info.offsets = tuple(offsets)
            info.checks.append(any_of(first, info.root_value(iv) >= previous + extent))
        else:
            info.checks.append(first)       # the same region every iteration: computed once
        info.hoisted = True

    def _flat(self, buf: Buffer, offsets, indices) -> PrimExpr:
        flat, stride = None, 1
        strides = buf.strides or (None,) * len(buf.shape)
        for dim, off, idx, fixed in reversed(list(zip(buf.shape, offsets, indices, strides))):
            stride = stride if fixed is None else fixed
            if isinstance(off, _Circular):
                term = floormod(idx, dim) * stride
                flat = term if flat is None else term + flat
                stride = stride * dim
                continue
            term = (idx - off) * stride
            flat = term if flat is None else term + flat
            stride = stride * dim
        return simplify(flat if flat is not None else convert(0))

    # ------------------------------------------------------------------ bounds
    def _leaf_pos(self, parent, stage) -> int:
        if parent is None:
            raise LowerError(f"compute_at: {stage.op.name} is attached to a stage that is "
                             "inlined or not a compute stage")
        for k, leaf in enumerate(parent.leaves):
            if leaf is stage.attach_ivar:
                return k
        raise LowerError(f"compute_at: {stage.attach_ivar.name} is no longer a loop of "
                         f"{parent.stage.op.name} (split or fused after compute_at?)")

    def _infer_bound(self, info, computes) -> None:
        stage = info.stage
        op = stage.op
        for iv in op.reduce_axis:
            info.root_dom[iv] = (iv.dom_min, iv.extent)
        full = {iv: (convert(0), iv.extent) for iv in op.axis}
        info.root_dom.update(full)
        if stage.attach_type != "scope":
            return
        parent = self.infos.get(stage.attach_stage)
        pos = self._leaf_pos(parent, stage)
        outer_relaxed = dict(zip((leaf.var for leaf in parent.leaves[pos + 1:]),
                                 _ranges(parent, parent.leaves[pos + 1:])))
        regions = [None] * len(op.axis)
        for reader in computes:
            reader_info = self.infos[reader]
            loads = _loads_of(reader_info.bodies, stage, self.sch)
            if not loads:
                continue
            if reader is parent.stage:
                relaxed = outer_relaxed
            elif reader.attach_stage is parent.stage and self._leaf_pos(parent, reader) >= pos:
                relaxed = {**outer_relaxed, **dict(zip((leaf.var for leaf in reader_info.leaves),
                                                       _ranges(reader_info, reader_info.leaves)))}
            else:
                raise LowerError(f"compute_at: {op.name} is read by {reader.op.name}, which "
                                 f"is not inside {parent.stage.op.name}'s loop "
                                 f"{stage.attach_ivar.name}")
            all_ranges = {**parent.leaf_ranges(), **reader_info.leaf_ranges()}
            roots = list(reader.op.axis) + list(reader.op.reduce_axis)
            values = {iv.var: reader_info.root_value(iv) for iv in roots}
            for load in loads:
                for d, idx in enumerate(load.indices):
                    idx = simplify(substitute(idx, values), all_ranges)
                    lo_hi = _interval(idx, relaxed, all_ranges)
                    if lo_hi is None or regions[d] == "full":
                        regions[d] = "full"
                    elif regions[d] is None:
                        regions[d] = lo_hi
                    else:
                        regions[d] = (simplify(minimum(regions[d][0], lo_hi[0]), all_ranges),
                                      simplify(maximum(regions[d][1], lo_hi[1]), all_ranges))
        for d, iv in enumerate(op.axis):
            region = regions[d]
            dom = full[iv]
            if region is not None and region != "full":
                lo, hi = region
                extent = simplify(hi - lo + 1)
                n, full_n = const_int(extent), const_int(iv.extent)
                if n is not None and (full_n is None or n < full_n):
                    dom = (lo, extent)
                    info.partial.add(iv)
            info.root_dom[iv] = dom

    # ------------------------------------------------------------------ loops
    def _derive_loops(self, info) -> None:
        stage = info.stage
        for iv, (_, extent) in info.root_dom.items():
            info.ext[iv] = simplify(convert(extent))
        for rel in stage.relations:
            if isinstance(rel, Split):
                ext = info.ext[rel.parent]
                if rel.factor is not None:
                    inner = convert(rel.factor)
                    outer = simplify((ext + (rel.factor - 1)) // rel.factor)
                else:
                    outer = convert(rel.nparts)
                    inner = simplify((ext + (rel.nparts - 1)) // rel.nparts)
                info.ext[rel.outer], info.ext[rel.inner] = outer, inner
            else:
                info.ext[rel.fused] = simplify(info.ext[rel.outer] * info.ext[rel.inner])
        for leaf in info.leaves:
            info.rel[leaf] = leaf.var
        for rel in reversed(stage.relations):
            if isinstance(rel, Split):
                value = rel_value = info.rel[rel.outer] * info.ext[rel.inner] + info.rel[rel.inner]
                info.rel[rel.parent] = simplify(value)
                covered = simplify(info.ext[rel.outer] * info.ext[rel.inner])
                if const_int(covered - info.ext[rel.parent]) != 0:
                    info.checks.append(rel_value < info.ext[rel.parent])
            elif isinstance(rel, Fuse):
                fused = info.rel[rel.fused]
                info.rel[rel.outer] = simplify(fused // info.ext[rel.inner])
                info.rel[rel.inner] = simplify(fused % info.ext[rel.inner])
        for iv in info.partial:
            value = info.root_value(iv)
            info.checks.append(value >= 0)
            info.checks.append(value < iv.extent)

    def _kind(self, stage, leaf) -> str:
        return stage.iter_var_attrs.get(leaf, "serial")

    def _to_load(self, expr):
        lowering = self

        class _ToLoad(Mutator):
            def visit_TensorLoad(self, node):
                indices = [self.visit(i) for i in node.indices]
                stage = lowering.sch.stage_map.get(node.tensor.op)
                info = lowering.infos.get(stage)
                buf = info.buffers[node.tensor.value_index] if info is not None \
                    else lowering.buffers[stage]
                offsets = info.offsets if info is not None else (0,) * len(indices)
                return Load(buf, lowering._flat(buf, offsets, indices))

        return _ToLoad().visit(expr)

    def _build_extern(self, info):
        op = info.stage.op
        mapping = {}
        for placeholder, t in zip(op.input_buffers, op.inputs):
            stage = self.sch.stage_map.get(t.op)
            source = self.infos.get(stage)
            mapping[placeholder] = source.buffers[t.value_index] if source is not None \
                else self.buffers[stage]
        for k, placeholder in enumerate(op.output_buffers):
            mapping[placeholder] = info.buffers[k]

        class _Rebind(Mutator):
            def visit_Load(self, node):
                return Load(mapping.get(node.buffer, node.buffer), self.visit(node.index))

            def visit_Store(self, node):
                return Store(mapping.get(node.buffer, node.buffer), self.visit(node.value),
                             self.visit(node.index))

            def visit_BufferPointer(self, node):
                return BufferPointer(mapping.get(node.buffer, node.buffer), self.visit(node.offset))
        return _Rebind().visit(op.body)

    def _build_scan(self, info):
        """``out_k[:r] = init_k``, then ``for t in [r, T)``: ``out_k[t] = update_k[t]`` for
        every state k (state_j reads out_j)."""
        op = info.stage.op
        lowering = self

        def nest(part, k, start, time=None):
            axis = part.op.axis
            body = part.op.body
            for j, state in enumerate(op.states):
                body = replace_tensor(body, state, op.output(j))
            values = {iv.var: iv.var for iv in axis}
            if time is not None:
                values[axis[0].var] = time + start
            buf = info.buffers[k]
            index = lowering._flat(buf, info.offsets, [values[iv.var] for iv in axis])
            stmt = Store(buf, lowering._to_load(substitute(body, values)), index)
            for d in range(len(axis) - 1, 0 if time is not None else -1, -1):
                stmt = For(axis[d].var, convert(0), simplify(convert(axis[d].extent)),
                           "serial", stmt)
            return stmt
        steps = const_int(op.inits[0].shape[0])
        if steps is None:
            raise LowerError(f"scan {op.name}: init needs a constant number of rows")
        time = Var(f"{op.name}.t")
        updates = seq(*[nest(u, k, steps, time) for k, u in enumerate(op.updates)])
        loop = For(time, convert(0), simplify(convert(op.outputs[0].shape[0] - steps)),
                   "serial", updates)
        return seq(*[nest(i, k, 0) for k, i in enumerate(op.inits)], loop)

    def _build(self, info) -> object:
        stage = info.stage
        op = stage.op
        if isinstance(op, ExternOp):
            return self._build_extern(info)
        if isinstance(op, ScanOp):
            return self._build_scan(info)
        roots = list(op.axis) + list(op.reduce_axis)
        values = {iv.var: info.root_value(iv) for iv in roots}
        out_index = self._flat(info.buffer, info.offsets, [values[iv.var] for iv in op.axis])
        buffers = [info.buffers[k] for k in range(len(info.bodies))]
        checks = [simplify(c) for c in info.checks]
        if stage.store_predicate is not None:
            checks.append(simplify(self._to_load(substitute(stage.store_predicate, values))))
        leaves = info.leaves
        body = info.body
        init = None
        first_reduce = len(leaves)
        if isinstance(body, Reduce):
            sources = [self._to_load(substitute(x, values)) for x in body.source]
            accs = [Load(buf, out_index) for buf in buffers]
            update = self._assign(buffers, body.combiner.combine(accs, sources), out_index)
            if body.condition is not None:
                update = IfThenElse(self._to_load(substitute(body.condition, values)), update)
            first_reduce = next(k for k, leaf in enumerate(leaves) if leaf.kind == IterVar.REDUCE)
            start = body.identity() if body.init is None else body.init
            init = self._init_nest(info, first_reduce, checks, buffers, start)
            stmt = update
        else:
            stmt = self._assign(buffers, [self._to_load(substitute(b, values))
                                          for b in info.bodies], out_index)
        positions = {leaf.var: k for k, leaf in enumerate(leaves)}
        by_level: dict = {}
        for cond in checks:
            by_level.setdefault(_level(cond, positions), []).append(cond)
        innermost = len(leaves) - 1
        if stage.tensorized is not None:
            innermost, stmt, reset = self._tensorized(info, values, out_index, by_level)
            init = None if reset is None else \
                self._reset_nest(info, first_reduce, innermost + 1, checks, reset)
        for pos in range(innermost, -2, -1):
            if pos + 1 == first_reduce and init is not None:
                stmt = seq(init, stmt)
            for child in reversed(info.children.get(pos, [])):
                stmt = seq(self._build(child), stmt)
                if getattr(child, "hoisted", False):
                    continue            # a rolling buffer outlives the iterations: see below
                for k in sorted(child.buffers, reverse=True):
                    stmt = Allocate(child.buffers[k], stmt)
            if pos in by_level:
                stmt = IfThenElse(simplify(all_of(*by_level[pos])), stmt)
            if pos >= 0:
                leaf = leaves[pos]
                stmt = seq(*self._prefetches(info, pos, values), stmt)
                stmt = For(leaf.var, convert(0), info.ext[leaf], self._kind(stage, leaf), stmt)
                pragmas = stage.pragmas.get(leaf, {})
                if pragmas.get("unroll_explicit", True) and "auto_unroll_max_step" in pragmas:
                    stmt = _auto_unroll(stmt, pragmas["auto_unroll_max_step"])
                for child in info.children.get(pos, []):
                    if getattr(child, "hoisted", False):
                        for k in sorted(child.buffers, reverse=True):
                            stmt = Allocate(child.buffers[k], stmt)
        return stmt

    def _tensorized(self, info, values, out_index, by_level) -> tuple:
        """(position, statement) of the tensor intrinsic replacing the innermost loops."""
        from ..tensorize import tensorize_stmt

        pos, stmt, reset = tensorize_stmt(self, info, values, out_index, LowerError)
        stage = info.stage
        name = f"tensorize {stage.op.name} at {info.leaves[pos].var.name}"
        # Guards inside the intrinsic: a compute_at region's bounds often hold for every
        # iteration of the loops around it (proven here and dropped); what stays would make
        # the intrinsic run on a partial region.
        ranges = self._loop_ranges()
        own = {leaf.var for leaf in info.leaves}
        for level in [level for level in by_level if level >= pos]:
            kept = [c for c in by_level.pop(level) if const_int(simplify(c, ranges)) != 1]
            if not kept:
                continue
            if stage.attach_type == "scope" and any(vars_in(c) - own for c in kept):
                raise LowerError(
                    f"{name}: the region compute_at gives {stage.op.name} inside "
                    f"{stage.attach_stage.op.name}'s loop {stage.attach_ivar.var.name} is not "
                    f"always whole ({', '.join(map(str, kept))} does not hold for every "
                    "iteration), so the intrinsic would run on a partial region: split the "
                    f"loops of {stage.attach_stage.op.name} by factors that divide the extents")
            raise LowerError(f"{name}: a split inside does not divide its loop evenly "
                             f"({', '.join(map(str, kept))}), so the intrinsic would run on a "
                             "partial region")
        inside = [child.stage.op.name for p, children in sorted(info.children.items())
                  if p >= pos for child in children]
        if inside:
            outer = (f"at {info.leaves[pos - 1].var.name} or further out" if pos > 0
                     else "at a loop of another stage, or at root")
            raise LowerError(f"{name}: {', '.join(inside)} is attached (compute_at) to a loop "
                             "the intrinsic replaces, and the intrinsic's body cannot compute "
                             f"it: attach it {outer}")
        if any(var in info.leaves[pos:] for _, var, _ in info.stage.prefetches):
            raise LowerError(f"{name}: a prefetch is on a loop inside it")
        return pos - 1, stmt, reset

    def _loop_ranges(self) -> dict:
        """Loop variable -> (0, extent - 1) for the constant-extent loops of every stage."""
        ranges = {}
        for info in self.infos.values():
            for leaf in getattr(info, "leaves", ()):
                extent = const_int(info.ext[leaf]) if leaf in info.ext else None
                if extent is not None and extent > 0:
                    ranges[leaf.var] = (0, extent - 1)
        return ranges

    def _prefetches(self, info, pos, values) -> list:
        """Prefetch hints for loop ``leaves[pos]``: the lines iteration ``+ offset`` reads."""
        leaf = info.leaves[pos]
        inner = info.leaves[pos + 1:]
        out = []
        for tensor, var, offset in info.stage.prefetches:
            if var is not leaf:
                continue
            for load in _loads_of(info.bodies, self.sch[tensor], self.sch):
                access = self._to_load(substitute(load, values))
                shifted = substitute(access.index, {leaf.var: leaf.var + offset})
                start = simplify(substitute(shifted, {iv.var: convert(0) for iv in inner}))
                line = max(1, 64 // _element_bytes(tensor.dtype))
                lines = min(64, -(-_span(shifted, inner, info) // line))
                if lines <= 1:
                    out.append(Prefetch(access.buffer, start))
                    continue
                k = Var(f"{tensor.name}.line")
                out.append(For(k, convert(0), convert(lines), "serial",
                               Prefetch(access.buffer, start + k * line)))
        return out

    @staticmethod
    def _assign(buffers, values, index):
        """Store every output; a tuple reduction computes all new values before storing."""
        if len(buffers) == 1:
            return Store(buffers[0], values[0], index)
        temps = [Var(f"{buf.name}.new", v.dtype) for buf, v in zip(buffers, values)]
        stmt = seq(*[Store(buf, t, index) for buf, t in zip(buffers, temps)])
        for t, v in reversed(list(zip(temps, values))):
            stmt = LetStmt(t, v, stmt)
        return stmt

    def _init_nest(self, info, first_reduce, checks, buffers, start):
        stage = info.stage
        copies, vmap = self._init_copies(info, first_reduce, len(info.leaves))
        values = [info.root_value(iv) for iv in stage.op.axis]
        index = simplify(substitute(self._flat(info.buffer, info.offsets, values), vmap))
        axis_values = {iv.var: substitute(v, vmap) for iv, v in zip(stage.op.axis, values)}
        start = [self._to_load(substitute(v, axis_values)) for v in start]
        stmt = seq(*[Store(buf, v, index) for buf, v in zip(buffers, start)])
        return self._copy_nest(info, copies, vmap, checks, stmt)

    def _reset_nest(self, info, first_reduce, pos, checks, reset):
        """A tensor intrinsic's ``reset`` before the reduction loops outside it: over copies
        of the spatial loops between them and the intrinsic, the reduction variables at 0."""
        copies, vmap = self._init_copies(info, first_reduce, pos)
        zeros = {leaf.var: convert(0) for leaf in info.leaves[:pos]
                 if leaf.kind == IterVar.REDUCE}
        return self._copy_nest(info, copies, vmap, checks, substitute(reset, {**vmap, **zeros}))

    @staticmethod
    def _init_copies(info, first_reduce, end):
        """The spatial loops among ``leaves[first_reduce + 1:end]``, and a fresh variable for
        each, which an accumulation's start runs over before its reduction loops."""
        copies = [leaf for leaf in info.leaves[first_reduce + 1:end]
                  if leaf.kind != IterVar.REDUCE]
        return copies, {leaf.var: Var(f"{leaf.var.name}.init", leaf.var.dtype)
                        for leaf in copies}

    def _copy_nest(self, info, copies, vmap, checks, stmt):
        """``stmt`` in the loops ``copies`` (their variables renamed by ``vmap``) under the
        checks that read them and no reduction variable."""
        stage = info.stage
        reduce_vars = {leaf.var for leaf in info.leaves if leaf.kind == IterVar.REDUCE}
        positions = {leaf.var: k for k, leaf in enumerate(copies)}
        by_level: dict = {}
        for cond in checks:
            used = vars_in(cond)
            if used & reduce_vars or not used & set(vmap):
                continue
            cond = substitute(cond, vmap)
            by_level.setdefault(_level(cond, {vmap[v]: k for v, k in positions.items()}),
                                []).append(cond)
        for pos in range(len(copies) - 1, -1, -1):
            if pos in by_level:
                stmt = IfThenElse(simplify(all_of(*by_level[pos])), stmt)
            leaf = copies[pos]
            stmt = For(vmap[leaf.var], convert(0), info.ext[leaf], self._kind(stage, leaf), stmt)
        return stmt


# --------------------------------------------------------------------------- helpers

def _element_bytes(dtype: str) -> int:
    return 1 if dtype == "bool" else dtype_bits(dtype) // 8


def _span(index, inner, info) -> int:
    """Elements between the lowest and highest ``index`` over the inner loops (0: unknown)."""
    terms, _ = linear(index)
    inner_vars = {iv.var: iv for iv in inner}
    span = 0
    for atom, c in terms.values():
        if atom in inner_vars:
            n = const_int(info.ext[inner_vars[atom]])
            if n is None:
                return 0
            span += abs(c) * (n - 1)
        elif vars_in(atom) & set(inner_vars):
            return 0
    return span + 1


def _aligned_strides(shape, aligns):
    """Row-major strides with ``storage_align``'s padding: stride[d] % factor == offset."""
    if not aligns:
        return None
    dims = [const_int(d) for d in shape]
    if any(d is None for d in dims):
        raise LowerError("storage_align needs a constant shape")
    strides = [1] * len(dims)
    for d in range(len(dims) - 1, -1, -1):
        stride = 1 if d == len(dims) - 1 else strides[d + 1] * dims[d + 1]
        if d in aligns:
            factor, offset = aligns[d]
            stride += (offset - stride) % factor
        strides[d] = stride
    return strides


def _auto_unroll(stmt, max_step: int):
    """Mark serial loops whose whole nest runs at most ``max_step`` iterations as unrolled."""
    def visit(s):
        if isinstance(s, For):
            body, inner = visit(s.body)
            n = const_int(s.extent)
            if n is None:
                return For(s.var, s.min, s.extent, s.kind, body), INF
            trips = n * max(inner, 1)
            kind = "unrolled" if s.kind == "serial" and trips <= max_step else s.kind
            return For(s.var, s.min, s.extent, kind, body), trips
        if s is None or not hasattr(s, "_fields") or isinstance(s, PrimExpr):
            return s, 0
        parts = []
        most = 0
        for name in s._fields:
            child = getattr(s, name)
            if isinstance(child, tuple) and name == "seq":
                new = []
                for c in child:
                    c, t = visit(c)
                    new.append(c)
                    most += t
                parts.append(tuple(new))
            elif hasattr(child, "_fields") and not isinstance(child, PrimExpr):
                child, t = visit(child)
                most = max(most, t)
                parts.append(child)
            else:
                parts.append(child)
        return type(s)(*parts), most
    return visit(stmt)[0]


class _Circular:
    """The offset of a rolling buffer's circular dimension: indexed modulo its extent."""

    def __repr__(self):
        return "circular"


def _level(cond, positions: dict) -> int:
    return max((positions[v] for v in vars_in(cond) if v in positions), default=-1)


def _ranges(info, leaves) -> list:
    out = []
    for leaf in leaves:
        n = const_int(info.ext[leaf])
        out.append((0, n - 1) if n is not None else (-INF, INF))
    return out


def _interval(expr, relaxed: dict, all_ranges: dict):
    """(lo, hi) expressions of ``expr`` when the ``relaxed`` vars sweep their ranges.

    Vars not relaxed stay symbolic.  Returns None when no finite bound is found.
    """
    terms, const = linear(expr)
    lo_terms, hi_terms = {}, {}
    lo_const = hi_const = const
    for key, (atom, c) in terms.items():
        atom_vars = vars_in(atom)
        if not atom_vars & set(relaxed):
            lo_terms[key] = hi_terms[key] = [atom, c]
            continue
        if isinstance(atom, Var):
            a, b = relaxed[atom]
        else:
            a, b = bound(atom, {**all_ranges, **relaxed})
        if a in (INF, -INF) or b in (INF, -INF):
            return None
        lo_const += min(c * a, c * b)
        hi_const += max(c * a, c * b)
    return (from_linear(lo_terms, lo_const, expr.dtype),
            from_linear(hi_terms, hi_const, expr.dtype))
