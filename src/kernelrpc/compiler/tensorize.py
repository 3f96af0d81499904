"""Tensor intrinsics (TVM's ``te.decl_tensor_intrin`` / ``Stage.tensorize``).

An intrinsic declares a small computation (``op``: a ``te.compute`` over placeholders of
constant shape) and the statement that computes it (``fcompute(ins, outs)``, written with
``ir_builder``). ``s[C].tensorize(axis, intrin)`` replaces C's loops from ``axis`` inward
with that statement. Lowering checks that the replaced loops compute exactly the declared
computation (same expression tree, same reducer, loop extents equal to the intrinsic's
axes, every access an affine function of those loops that the intrinsic's indexing
reproduces); anything else is a ``LowerError``, never a different result. The intrinsic's
body reads and writes the real buffers through :class:`~.ir_builder.BufferView`\\ s
(offset and strides of the region the replaced loops cover).

For a reduction split so that some of its loops stay outside the intrinsic,
``fcompute`` returns ``(body, reset, update)`` as in TVM: ``reset`` (a statement) starts the
region's accumulators, once before those outer reduction loops, and ``update`` accumulates on
every iteration, so that the loops hold no branch and a compiler can keep the accumulators in
registers across them; without ``reset`` (None), ``body`` computes the region from scratch
on their first iteration and ``update`` accumulates on the others.
"""
from __future__ import annotations

from .expr import FloatImm, IntImm, PrimExpr, Var, all_of
from .ir import Evaluate, IfThenElse, Stmt, substitute, vars_in
from .ir_builder import BufferView
from .tensor import ComputeOp, IterVar, PlaceholderOp, Reduce, Tensor, TensorLoad

__all__ = ["TensorIntrin", "decl_tensor_intrin"]


class TensorIntrin:
    def __init__(self, op: ComputeOp, fcompute, name: str):
        self.op, self.fcompute, self.name = op, fcompute, name

    def __repr__(self):
        return f"TensorIntrin({self.name}: {self.op.name})"


def decl_tensor_intrin(op, fcompute, name: str = "tensor_intrin", binds=None,
                       scalar_params=None, default_buffer_params=None) -> TensorIntrin:
    """Declare the intrinsic computing ``op`` (a ComputeOp or its output tensor).

    ``fcompute(ins, outs)`` gets one buffer per input of ``op`` (in ``op.input_tensors``
    order) and per output, and returns an ``ir_builder`` statement, or
    ``(body, reset, update)`` for a reduction.
    """
    if binds is not None or scalar_params is not None or default_buffer_params is not None:
        raise TypeError("decl_tensor_intrin: binds=, scalar_params= and "
                        "default_buffer_params= are not supported; buffer offsets and "
                        "strides come from the tensorized region")
    if isinstance(op, Tensor):
        op = op.op
    if not isinstance(op, ComputeOp) or len(op.outputs) != 1:
        raise TypeError("decl_tensor_intrin: op must be a single-output te.compute")
    for iv in list(op.axis) + list(op.reduce_axis):
        if not isinstance(iv.extent, IntImm):
            raise TypeError(f"decl_tensor_intrin: axis {iv.var.name} of {op.name} needs a "
                            "constant extent")
    for t in op.input_tensors:
        if not isinstance(t.op, PlaceholderOp):
            raise TypeError(f"decl_tensor_intrin: input {t.name} of {op.name} must be a "
                            "te.placeholder")
    return TensorIntrin(op, fcompute, name)


def tensorize_stmt(lowering, info, values, out_index, error):
    """The intrinsic's statement in place of ``info``'s loops from the tensorized leaf
    inward. Returns (leaf position, statement, reset): ``reset`` (or None) is the statement
    starting the accumulators, to run before the reduction loops outside the intrinsic (with
    their variables at 0). ``error(msg)`` builds the exception."""
    from .lower.arith import const_int, from_linear, linear, simplify

    stage = info.stage
    leaf_iv, intrin = stage.tensorized
    iop = intrin.op
    where = f"tensorize {stage.op.name} at {leaf_iv.var.name} with {intrin.name}"
    leaves = info.leaves
    pos = next(k for k, leaf in enumerate(leaves) if leaf is leaf_iv)
    inner = leaves[pos:]
    spatial = [leaf for leaf in inner if leaf.kind != IterVar.REDUCE]
    reduce = [leaf for leaf in inner if leaf.kind == IterVar.REDUCE]
    if len(spatial) != len(iop.axis) or len(reduce) != len(iop.reduce_axis):
        raise error(f"{where}: the loops inside are {[v.var.name for v in inner]} "
                    f"({len(spatial)} spatial, {len(reduce)} reduction), the intrinsic has "
                    f"{len(iop.axis)} spatial and {len(iop.reduce_axis)} reduction axes")
    var_map = {}
    for leaf, axis in zip(spatial + reduce, list(iop.axis) + list(iop.reduce_axis)):
        extent = const_int(info.ext[leaf])
        if extent != axis.extent.value:
            raise error(f"{where}: loop {leaf.var.name} has extent "
                        f"{extent if extent is not None else info.ext[leaf]}, the "
                        f"intrinsic's axis {axis.var.name} has {axis.extent.value}")
        var_map[axis.var] = leaf.var
    inner_vars = {leaf.var for leaf in inner}

    def affine(index, what):
        """(base, {inner var: coefficient}) of a flat index, or an error if not affine."""
        terms, constant = linear(simplify(index))
        coeffs, rest = {}, {}
        for key, (atom, coeff) in terms.items():
            if isinstance(atom, Var) and atom in inner_vars:
                coeffs[atom] = coeff
            elif vars_in(atom) & inner_vars:
                raise error(f"{where}: the index of {what} is not affine in the tensorized "
                            f"loops ({index})")
            else:
                rest[key] = [atom, coeff]
        return from_linear(rest, constant, index.dtype), coeffs

    def view(name, shape, dtype, buf, index, dims, what):
        base, coeffs = affine(index, what)
        strides = [coeffs.pop(var_map[d], 0) for d in dims]
        if coeffs:
            raise error(f"{where}: {what} depends on loop(s) "
                        f"{sorted(v.name for v in coeffs)} that the intrinsic's access of "
                        f"{name} does not")
        return BufferView(name, shape, dtype, buf, base, strides)

    pairs: list = []
    body = info.body
    if len(info.bodies) != 1 or not _same(body, iop.bodies[0], pairs):
        raise error(f"{where}: {stage.op.name} does not compute what {iop.name} declares")
    ins: dict = {}
    for real, declared in pairs:
        dims = declared.indices
        if any(not isinstance(d, Var) or d not in var_map for d in dims) or \
                len(set(dims)) != len(dims):
            raise error(f"{where}: the intrinsic must index {declared.tensor.name} by its own "
                        "axes, one per dimension")
        load = lowering._to_load(substitute(real, values))
        v = view(declared.tensor.name, declared.tensor.shape, declared.tensor.dtype,
                 load.buffer, load.index, dims, f"{real.tensor.name}")
        seen = ins.setdefault(declared.tensor, v)
        if seen is not v and (seen.data is not v.data or any(
                const_int(simplify(a - b)) != 0 for a, b in
                zip((seen.elem_offset, *seen.strides), (v.elem_offset, *v.strides)))):
            raise error(f"{where}: {declared.tensor.name} is read at two different regions")
    missing = [t.name for t in iop.input_tensors if t not in ins]
    if missing:
        raise error(f"{where}: the intrinsic's inputs {missing} are not read by its body")
    out_t = iop.output(0)
    out = view(out_t.name, out_t.shape, out_t.dtype, info.buffer, out_index,
               [a.var for a in iop.axis], f"the output {stage.op.name}")
    result = intrin.fcompute([ins[t] for t in iop.input_tensors], [out])
    parts = tuple(result) if isinstance(result, (tuple, list)) else (result, None, None)
    # a part may be one call of a C function (tir.call_extern): a statement of its own
    parts = tuple(Evaluate(p) if isinstance(p, PrimExpr) else p for p in parts)
    if len(parts) != 3 or not isinstance(parts[0], Stmt):
        raise error(f"{where}: fcompute must return a statement or (body, reset, update)")
    stmt, reset, update = parts
    outer_reduce = [leaf for leaf in leaves[:pos] if leaf.kind == IterVar.REDUCE]
    if not outer_reduce or not isinstance(body, Reduce):
        return pos, stmt, None
    if not isinstance(update, Stmt):
        raise error(f"{where}: the reduction loops {[v.var.name for v in outer_reduce]} "
                    "stay outside the intrinsic, so fcompute must return "
                    "(body, reset, update)")
    if isinstance(reset, Stmt):
        return pos, update, reset
    first = all_of(*[leaf.var == 0 for leaf in outer_reduce])
    return pos, IfThenElse(first, stmt, update), None


def _same(a, b, pairs: list) -> bool:
    """Whether stage expression ``a`` and intrinsic expression ``b`` compute the same thing;
    their tensor loads are collected as (a, b) pairs (indices are compared by the caller)."""
    if type(a) is not type(b) or getattr(a, "dtype", None) != getattr(b, "dtype", None):
        return False
    if isinstance(a, TensorLoad):
        pairs.append((a, b))
        return True
    if isinstance(a, (IntImm, FloatImm)):
        return a.value == b.value
    if isinstance(a, Reduce):
        if a.combiner is not b.combiner:
            return False
        if a.condition is not None or b.condition is not None or a.init is not None \
                or b.init is not None or a.value_index != b.value_index:
            return False
        return len(a.source) == len(b.source) and all(
            _same(x, y, pairs) for x, y in zip(a.source, b.source))
    if isinstance(a, Var) or not isinstance(a, PrimExpr):
        return False
    for field in a._fields:
        x, y = getattr(a, field), getattr(b, field)
        if isinstance(x, PrimExpr):
            if not _same(x, y, pairs):
                return False
        elif isinstance(x, tuple):
            if len(x) != len(y) or not all(
                    _same(p, q, pairs) if isinstance(p, PrimExpr) else p == q
                    for p, q in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


