"""Schedules: how each compute stage's loops are split, ordered, annotated and placed."""
from __future__ import annotations

import warnings

from .expr import Var, convert, if_then_else, logical_and
from .ir import Mutator, substitute
from .tensor import (ComputeOp, ExternOp, IterVar, PlaceholderOp, Reduce, ScanOp, Tensor,
                     TensorLoad)


class ScheduleError(ValueError):
    """A schedule primitive was applied to an axis or stage it does not fit."""


class SchedulePrimitiveIgnored(UserWarning):
    """A TVM schedule primitive that is accepted but changes nothing in code for a CPU here
    (as :class:`~kernelrpc.compiler.target.TargetOptionIgnored` for target options)."""


#: Storage scopes that are ordinary memory on a CPU (others name GPU memories).
CPU_SCOPES = ("global", "local")


class Split:
    def __init__(self, parent: IterVar, outer: IterVar, inner: IterVar, factor, nparts):
        self.parent, self.outer, self.inner = parent, outer, inner
        self.factor, self.nparts = factor, nparts


class Fuse:
    def __init__(self, outer: IterVar, inner: IterVar, fused: IterVar):
        self.outer, self.inner, self.fused = outer, inner, fused


def _step(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ScheduleError(f"auto_unroll_max_step must be a non-negative int, got {value!r}")
    return value


#: supported pragma -> validator of its value
PRAGMAS = {"auto_unroll_max_step": _step,
           "unroll_explicit": lambda v: True if v is None else bool(v)}

#: Stage annotation -> For kind in the lowered IR
ITER_KINDS = {"vectorize": "vectorized", "unroll": "unrolled", "parallel": "parallel"}


class Stage:
    """The schedule of one operation (``s[tensor]``)."""

    def __init__(self, op):
        self.op = op
        self.reset()
        self.attach_type = "root"          # root | inline | scope
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.storage_aligns: dict = {}      # dimension -> (factor, offset)
        self.store_predicate = None         # stores happen only where it holds
        self.rolling = False                # rolling_buffer(): a circular buffer across iterations

    def reset(self) -> None:
        op = self.op
        roots = list(op.axis) + list(op.reduce_axis) if isinstance(op, ComputeOp) else []
        self.all_iter_vars = list(roots)
        self.leaf_iter_vars = list(roots)
        self.relations: list = []
        self.iter_var_attrs: dict = {}
        self.pragmas: dict = {}             # leaf IterVar -> {pragma name: value}
        self.prefetches: list = []          # (tensor, leaf IterVar, offset)
        self.tensorized = None              # (leaf IterVar, TensorIntrin)

    def __repr__(self):
        return f"stage({self.op.name})"

    # ------------------------------------------------------------------ helpers
    def _check_leaf(self, iv: IterVar) -> int:
        for k, leaf in enumerate(self.leaf_iter_vars):
            if leaf is iv:
                return k
        raise ScheduleError(f"{iv!r} is not a leaf axis of stage {self.op.name} "
                            f"(leaves: {[v.name for v in self.leaf_iter_vars]})")

    def _new_iv(self, name: str, kind: str) -> IterVar:
        iv = IterVar(0, 0, Var(name), kind)
        self.all_iter_vars.append(iv)
        return iv

    def _compute_only(self, what: str) -> None:
        if not isinstance(self.op, ComputeOp):
            kind = "an extern op" if isinstance(self.op, ExternOp) else "a placeholder"
            raise ScheduleError(f"{what}: {self.op.name} is {kind}, not a compute stage")

    # ------------------------------------------------------------------ loop primitives
    def split(self, parent: IterVar, factor=None, nparts=None):
        """Split ``parent`` into (outer, inner); give exactly one of ``factor``/``nparts``."""
        self._compute_only("split")
        if (factor is None) == (nparts is None):
            raise ScheduleError("split needs exactly one of factor= or nparts=")
        amount = factor if factor is not None else nparts
        if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
            raise ScheduleError(f"split amount must be a positive int, got {amount!r}")
        pos = self._check_leaf(parent)
        outer = self._new_iv(f"{parent.name}.outer", parent.kind)
        inner = self._new_iv(f"{parent.name}.inner", parent.kind)
        self.relations.append(Split(parent, outer, inner, factor, nparts))
        self.leaf_iter_vars[pos:pos + 1] = [outer, inner]
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int):
        xo, xi = self.split(x_parent, factor=x_factor)
        yo, yi = self.split(y_parent, factor=y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *args: IterVar) -> IterVar:
        """Fuse consecutive leaf axes (outermost first) into one."""
        self._compute_only("fuse")
        if not args:
            raise ScheduleError("fuse needs at least one axis")
        fused = args[0]
        for inner in args[1:]:
            p_outer, p_inner = self._check_leaf(fused), self._check_leaf(inner)
            if p_inner != p_outer + 1:
                raise ScheduleError(f"fuse: {fused.name} and {inner.name} are not adjacent "
                                    "(outer first)")
            if fused.kind != inner.kind:
                raise ScheduleError("fuse: cannot fuse a reduction axis with a data axis")
            new = self._new_iv(f"{fused.name}.{inner.name}.fused", fused.kind)
            self.relations.append(Fuse(fused, inner, new))
            self.leaf_iter_vars[p_outer:p_outer + 2] = [new]
            fused = new
        return fused

    def reorder(self, *args: IterVar) -> None:
        """Put the given leaf axes in this order, in the positions they occupy together."""
        self._compute_only("reorder")
        positions = sorted(self._check_leaf(iv) for iv in args)
        if len(set(positions)) != len(args):
            raise ScheduleError("reorder: an axis is given twice")
        for pos, iv in zip(positions, args):
            self.leaf_iter_vars[pos] = iv

    def _annotate(self, iv: IterVar, what: str) -> None:
        self._compute_only(what)
        self._check_leaf(iv)
        if what == "parallel" and iv.kind == IterVar.REDUCE:
            raise ScheduleError("parallel: cannot run a reduction axis in parallel")
        if what == "vectorize" and iv.kind == IterVar.REDUCE:
            raise ScheduleError("vectorize: cannot vectorize a reduction axis")
        self.iter_var_attrs[iv] = ITER_KINDS[what]

    def vectorize(self, iv: IterVar) -> None:
        self._annotate(iv, "vectorize")

    def unroll(self, iv: IterVar) -> None:
        self._annotate(iv, "unroll")

    def parallel(self, iv: IterVar) -> None:
        self._annotate(iv, "parallel")

    def pragma(self, iv: IterVar, pragma_type: str, pragma_value=None) -> None:
        """TVM's pragmas on a loop: ``auto_unroll_max_step`` (unroll the loops inside whose
        total trip count is at most the value) and ``unroll_explicit`` (False: leave those
        loops to LLVM's unroller instead)."""
        self._compute_only("pragma")
        self._check_leaf(iv)
        if pragma_type not in PRAGMAS:
            raise ScheduleError(f"pragma {pragma_type!r} is not supported; known: "
                                f"{sorted(PRAGMAS)}")
        value = PRAGMAS[pragma_type](pragma_value)
        self.pragmas.setdefault(iv, {})[pragma_type] = value

    def tensorize(self, var: IterVar, intrin) -> None:
        """Replace the loops from ``var`` inward with ``intrin``'s body (TVM's tensorize); the
        match of the computation and of the loop extents is checked when lowering."""
        from .tensorize import TensorIntrin

        self._compute_only("tensorize")
        self._check_leaf(var)
        if not isinstance(intrin, TensorIntrin):
            raise ScheduleError(f"tensorize: expected a te.decl_tensor_intrin result, "
                                f"got {type(intrin).__name__}")
        self.tensorized = (var, intrin)

    def prefetch(self, tensor: Tensor, var: IterVar, offset) -> None:
        """At the start of every iteration of loop ``var``, prefetch the part of ``tensor``
        that iteration ``var + offset`` reads (one hint per 64-byte line; TVM's prefetch)."""
        self._compute_only("prefetch")
        self._check_leaf(var)
        if not any(t.op is tensor.op for t in self.op.input_tensors):
            raise ScheduleError(f"prefetch: {self.op.name} does not read {tensor.name}")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise ScheduleError(f"prefetch: offset must be an int, got {offset!r}")
        self.prefetches.append((tensor, var, offset))

    def storage_align(self, axis: IterVar, factor: int, offset: int) -> None:
        """Pad this stage's buffer so the stride of ``axis``'s dimension is
        ``k * factor + offset`` elements (TVM's storage_align; only for buffers lowering
        allocates, not for function arguments)."""
        self._compute_only("storage_align")
        dims = [k for k, iv in enumerate(self.op.axis) if iv is axis]
        if not dims:
            raise ScheduleError(f"storage_align: {axis!r} is not a root axis of {self.op.name}")
        if not (isinstance(factor, int) and factor > 0 and isinstance(offset, int)):
            raise ScheduleError("storage_align: factor must be a positive int, offset an int")
        self.storage_aligns[dims[0]] = (factor, offset % factor)

    def set_scope(self, scope: str) -> None:
        """The storage scope of the buffer lowering allocates for this stage (TVM's set_scope;
        shown in the lowered IR). "global" and "local" are both host memory on a CPU; a GPU
        scope ("shared", "warp", ...) is accepted with a SchedulePrimitiveIgnored warning."""
        if not isinstance(scope, str) or not scope:
            raise ScheduleError(f"set_scope: scope must be a non-empty str, got {scope!r}")
        if scope.split(".")[0] not in CPU_SCOPES:
            _ignored(f"set_scope({scope!r}) on {self.op.name}",
                     "that storage scope names GPU memory; on a CPU the buffer is ordinary "
                     "memory (the scope is recorded in the lowered IR)")
        self.scope = scope

    def set_store_predicate(self, predicate) -> None:
        """Store this stage's values only where ``predicate`` (an expression of its axes, root or
        leaf) holds; elsewhere its buffer keeps what it had (TVM's set_store_predicate)."""
        self._compute_only("set_store_predicate")
        from .expr import PrimExpr, is_bool
        predicate = convert(predicate)
        if not isinstance(predicate, PrimExpr) or not is_bool(predicate.dtype):
            raise ScheduleError(f"set_store_predicate: expected a condition, got {predicate!r}")
        self.store_predicate = predicate

    def double_buffer(self) -> None:
        """TVM's double_buffer: accepted with a SchedulePrimitiveIgnored warning (it overlaps a
        GPU's copies into shared memory with compute; a CPU has no such copy to overlap)."""
        _ignored(f"double_buffer() on {self.op.name}",
                 "double buffering overlaps asynchronous copies into a GPU's shared memory with "
                 "compute; on a CPU there is no such copy, so the stage keeps one buffer")

    def rolling_buffer(self) -> None:
        """TVM's rolling_buffer, for a stage computed at a loop (``compute_at``) whose region
        slides along one axis by a constant step per iteration: its buffer becomes circular
        along that axis (indexed modulo the region's extent) and lives across the loop's
        iterations, and each iteration computes only the part of the region the previous one
        did not (the whole region at the loop's first iteration). A region that does not move
        is computed once. Checked when lowering."""
        self._compute_only("rolling_buffer")
        self.rolling = True

    # ------------------------------------------------------------------ placement
    def compute_at(self, parent: "Stage", ivar: IterVar) -> None:
        """Compute this stage inside ``parent``'s loop ``ivar``, only the region it needs."""
        self._compute_only("compute_at")
        if not isinstance(parent, Stage):
            raise ScheduleError("compute_at: parent must be a Stage (s[tensor])")
        parent._check_leaf(ivar)
        if parent is self:
            raise ScheduleError("compute_at: a stage cannot be attached to itself")
        chain, outer = [self.op.name, parent.op.name], parent
        while outer.attach_type == "scope":
            outer = outer.attach_stage
            chain.append(outer.op.name)
            if outer is self:
                raise ScheduleError(f"compute_at: attaching {self.op.name} to {parent.op.name} "
                                    f"makes a cycle ({' -> '.join(chain)})")
        self.attach_type, self.attach_stage, self.attach_ivar = "scope", parent, ivar

    def compute_inline(self) -> None:
        self._compute_only("compute_inline")
        if self.op.reduce_axis:
            raise ScheduleError(f"compute_inline: {self.op.name} is a reduction")
        self.attach_type, self.attach_stage, self.attach_ivar = "inline", None, None

    def compute_root(self) -> None:
        self._compute_only("compute_root")
        self.attach_type, self.attach_stage, self.attach_ivar = "root", None, None


class Schedule:
    def __init__(self, outputs):
        self.outputs = [t.op for t in outputs]
        self.stages: list[Stage] = []
        self.stage_map: dict = {}
        for op in _topo_order(self.outputs):
            stage = Stage(op)
            self.stages.append(stage)
            self.stage_map[op] = stage

    def __getitem__(self, key) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        stage = self.stage_map.get(op)
        if stage is None:
            raise ScheduleError(f"{getattr(op, 'name', op)!r} is not part of this schedule")
        return stage

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute ``tensor`` into a new stage ``<name>.<scope>`` and copy it out.

        The original stage keeps its axes (so ``C.op.axis`` still works) and loses its
        splits; the new stage owns the computation, including the reduction.
        """
        stage = self[tensor]
        op = stage.op
        if not isinstance(op, ComputeOp):
            raise ScheduleError("cache_write: only compute tensors can be cached")
        if stage.attach_type == "inline":
            raise ScheduleError("cache_write: the stage is inlined")
        if len(op.outputs) > 1:
            raise ScheduleError(f"cache_write: {op.name} has several outputs")
        new_axis = [IterVar(iv.dom_min, iv.extent, Var(f"{iv.name}.c")) for iv in op.axis]
        vmap = {iv.var: n.var for iv, n in zip(op.axis, new_axis)}
        body = substitute(op.body, vmap)
        cache_op = ComputeOp(f"{op.name}.{scope}", new_axis, body, op.tag, op.attrs)
        cache = cache_op.output(0)
        copy_op = ComputeOp(op.name, op.axis, TensorLoad(cache, [iv.var for iv in op.axis]),
                            op.tag, op.attrs)
        stage.op = copy_op
        stage.reset()
        self.stage_map[copy_op] = stage
        cache_stage = Stage(cache_op)
        cache_stage.scope = scope
        self.stage_map[cache_op] = cache_stage
        self.stages.insert(self.stages.index(stage), cache_stage)
        if op in self.outputs:
            self.outputs[self.outputs.index(op)] = copy_op
        return cache

    def cache_read(self, tensor: Tensor, scope: str, readers) -> Tensor:
        """A new stage ``<name>.<scope>`` copies ``tensor``; ``readers`` read the copy instead.

        Each reader keeps its stage, axes and schedule (its op is rebuilt with the same
        IterVars), so ``compute_at`` can then place the copy inside a reader's loop.
        """
        readers = readers if isinstance(readers, (list, tuple)) else [readers]
        reader_stages = [self[r] for r in readers]
        if isinstance(tensor.op, ComputeOp) and len(tensor.op.outputs) > 1:
            raise ScheduleError(f"cache_read: {tensor.op.name} has several outputs")
        producer = self[tensor]
        axis = [IterVar(0, d, Var(f"ax{k}")) for k, d in enumerate(tensor.shape)]
        cache_op = ComputeOp(f"{tensor.name}.{scope}", axis,
                             TensorLoad(tensor, [iv.var for iv in axis]))
        cache = cache_op.output(0)
        for stage in reader_stages:
            if not isinstance(stage.op, ComputeOp):
                raise ScheduleError(f"cache_read: reader {stage.op.name} is not a compute")
            if not any(t.op is tensor.op for t in stage.op.input_tensors):
                raise ScheduleError(f"cache_read: {stage.op.name} does not read {tensor.name}")
            old = stage.op
            bodies = [replace_tensor(b, tensor, cache) for b in old.bodies]
            new = ComputeOp(old.name, old.axis, bodies, old.tag, old.attrs)
            stage.op = new
            self.stage_map[new] = stage
            if old in self.outputs:
                self.outputs[self.outputs.index(old)] = new
        cache_stage = Stage(cache_op)
        cache_stage.scope = scope
        self.stage_map[cache_op] = cache_stage
        self.stages.insert(self.stages.index(producer) + 1, cache_stage)
        return cache

    def rfactor(self, tensor: Tensor, axis: IterVar, factor_axis: int = 0) -> Tensor:
        """Factor the reduction of ``tensor`` over ``axis`` into a new stage (TVM's rfactor).

        ``axis`` is a root reduce axis or the outer/inner part of one split once. The new
        tensor ``<name>.rf`` keeps ``axis`` as a data-parallel dimension (at position
        ``factor_axis``) and reduces over the rest; ``tensor`` becomes the reduction of
        ``<name>.rf`` over that dimension. Both stages' loops start unscheduled.
        """
        stage = self[tensor]
        op = stage.op
        body = op.body if isinstance(op, ComputeOp) else None
        if not isinstance(body, Reduce) or len(op.outputs) > 1:
            raise ScheduleError(f"rfactor: {tensor.name} is not a single reduction")
        if axis in op.reduce_axis:
            root, split = axis, None
        else:
            split = next((r for r in stage.relations if isinstance(r, Split)
                          and axis in (r.outer, r.inner) and r.parent in op.reduce_axis), None)
            if split is None or any(r is not split and isinstance(r, (Split, Fuse))
                                    and axis in _rel_vars(r) for r in stage.relations):
                raise ScheduleError(f"rfactor: {axis.name} must be a reduce axis of "
                                    f"{tensor.name} or a part of one split")
            root = split.parent
        if not 0 <= factor_axis <= len(op.axis):
            raise ScheduleError(f"rfactor: factor_axis must be in [0, {len(op.axis)}]")
        from .lower.arith import const_int
        extent = const_int(root.extent)
        if extent is None:
            raise ScheduleError("rfactor: the reduce axis needs a constant extent")
        if split is None:
            kept_extent, other_extent = extent, 1
        else:
            f = split.factor if split.factor is not None else -(-extent // split.nparts)
            nparts = -(-extent // f)
            kept_extent, other_extent = (f, nparts) if axis is split.inner else (nparts, f)
        kept = IterVar(0, kept_extent, Var(f"{axis.name}.v"))
        rest = IterVar(0, other_extent, Var(f"{root.name}.rest"), IterVar.REDUCE)
        if split is None:
            value = kept.var
        elif axis is split.inner:
            value = rest.var * kept_extent + kept.var
        else:
            value = kept.var * other_extent + rest.var
        value = convert(root.dom_min) + value
        new_axis = [IterVar(iv.dom_min, iv.extent, Var(f"{iv.name}.rf")) for iv in op.axis]
        new_axis.insert(factor_axis, kept)
        vmap = {iv.var: n.var for iv, n in zip(op.axis, new_axis[:factor_axis]
                                                 + new_axis[factor_axis + 1:])}
        vmap[root.var] = value
        source = [substitute(x, vmap) for x in body.source]
        cond = None if body.condition is None else substitute(body.condition, vmap)
        if split is not None and kept_extent * other_extent != extent:
            inside = value < convert(root.dom_min) + extent
            cond = inside if cond is None else logical_and(cond, inside)
        reduce_axes = [a for a in body.axis if a is not root]
        if split is not None:
            reduce_axes.append(rest)
        if reduce_axes:
            rf_body = Reduce(body.combiner, source, reduce_axes, cond, 0, None)
        else:
            rf_body = source[0] if cond is None else if_then_else(cond, source[0],
                                                                  body.identity()[0])
        rf_op = ComputeOp(f"{op.name}.rf", new_axis, rf_body, op.tag, op.attrs)
        rf = rf_op.output(0)
        k = IterVar(0, kept_extent, Var(f"{axis.name}.v"), IterVar.REDUCE)
        indices = [iv.var for iv in op.axis]
        indices.insert(factor_axis, k.var)
        new_body = Reduce(body.combiner, [TensorLoad(rf, indices)], [k], None, 0, body.init)
        new_op = ComputeOp(op.name, op.axis, new_body, op.tag, op.attrs)
        stage.op = new_op
        stage.reset()
        self.stage_map[new_op] = stage
        rf_stage = Stage(rf_op)
        self.stage_map[rf_op] = rf_stage
        self.stages.insert(self.stages.index(stage), rf_stage)
        if op in self.outputs:
            self.outputs[self.outputs.index(op)] = new_op
        return rf

    def create_group(self, outputs, inputs, include_inputs: bool = False) -> "StageGroup":
        """The stages that compute ``outputs`` from ``inputs`` (TVM's create_group), to be
        placed together: ``compute_at`` / ``compute_inline`` / ``compute_root`` of the group
        apply to each of its stages; ``inputs`` themselves are members only with
        ``include_inputs``."""
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        inputs = inputs if isinstance(inputs, (list, tuple)) else [inputs]
        stops = {self[t].op for t in inputs}
        members: list = []

        def visit(op) -> None:
            stage = self[op]
            if stage in members:
                return
            if op in stops:
                if include_inputs and not isinstance(op, PlaceholderOp):
                    members.append(stage)
                return
            if isinstance(op, PlaceholderOp):
                return
            for t in op.input_tensors:
                visit(t.op)
            members.append(stage)

        for t in outputs:
            visit(self[t].op)
        if not members:
            raise ScheduleError("create_group: no stage lies between the outputs and the inputs")
        return StageGroup(members)

    def normalize(self) -> "Schedule":
        """TVM's normalize (loops start at 0): lowering always emits such loops already."""
        return self


class StageGroup:
    """A group of stages from :meth:`Schedule.create_group`, placed as one."""

    def __init__(self, stages):
        self.stages = list(stages)

    def __repr__(self):
        return f"group({', '.join(s.op.name for s in self.stages)})"

    def compute_at(self, parent: Stage, ivar: IterVar) -> None:
        """Every stage of the group computed inside ``parent``'s loop ``ivar``."""
        if parent in self.stages:
            raise ScheduleError(f"compute_at: {parent.op.name} is in the group itself")
        for stage in self.stages:
            stage.compute_at(parent, ivar)

    def compute_inline(self) -> None:
        for stage in self.stages:
            stage.compute_inline()

    def compute_root(self) -> None:
        for stage in self.stages:
            stage.compute_root()


def _ignored(what: str, why: str) -> None:
    warnings.warn(f"{what} has no effect here: {why}", SchedulePrimitiveIgnored, stacklevel=3)


def _rel_vars(rel) -> tuple:
    if isinstance(rel, Split):
        return (rel.parent, rel.outer, rel.inner)
    return (rel.outer, rel.inner, rel.fused)


def replace_tensor(body, old: Tensor, new: Tensor):
    """``body`` reading ``new`` wherever it read ``old``."""
    class _Replace(Mutator):
        def visit_TensorLoad(self, node):
            indices = tuple(self.visit(i) for i in node.indices)
            tensor = new if node.tensor.op is old.op else node.tensor
            return TensorLoad(tensor, indices)

    return _Replace().visit(body)


def create_schedule(ops) -> Schedule:
    """``te.create_schedule(C.op)`` or a list of output ops / tensors."""
    if not isinstance(ops, (list, tuple)):
        ops = [ops]
    tensors = [o if isinstance(o, Tensor) else o.output(0) for o in ops]
    return Schedule(tensors)


def _topo_order(outputs) -> list:
    order, seen = [], set()

    def visit(op):
        if id(op) in seen:
            return
        seen.add(id(op))
        for t in op.input_tensors:
            visit(t.op)
        order.append(op)

    for op in outputs:
        if not isinstance(op, (ComputeOp, ExternOp, PlaceholderOp, ScanOp)):
            raise ScheduleError(f"create_schedule: {op!r} is not an operation")
        visit(op)
    return order
