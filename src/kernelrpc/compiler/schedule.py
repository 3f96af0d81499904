"""Schedules: how each compute stage's loops are split, ordered, annotated and placed."""
from __future__ import annotations

from .expr import Var
from .ir import substitute
from .tensor import ComputeOp, IterVar, PlaceholderOp, Tensor, TensorLoad


class ScheduleError(ValueError):
    """A schedule primitive was applied to an axis or stage it does not fit."""


class Split:
    def __init__(self, parent: IterVar, outer: IterVar, inner: IterVar, factor, nparts):
        self.parent, self.outer, self.inner = parent, outer, inner
        self.factor, self.nparts = factor, nparts


class Fuse:
    def __init__(self, outer: IterVar, inner: IterVar, fused: IterVar):
        self.outer, self.inner, self.fused = outer, inner, fused


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

    def reset(self) -> None:
        op = self.op
        roots = list(op.axis) + list(op.reduce_axis) if isinstance(op, ComputeOp) else []
        self.all_iter_vars = list(roots)
        self.leaf_iter_vars = list(roots)
        self.relations: list = []
        self.iter_var_attrs: dict = {}

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
            raise ScheduleError(f"{what}: {self.op.name} is a placeholder, not a compute stage")

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
        if not isinstance(op, (ComputeOp, PlaceholderOp)):
            raise ScheduleError(f"create_schedule: {op!r} is not an operation")
        visit(op)
    return order
