"""The loop-nest IR that lowering produces and code generation consumes.

Buffers are flat: every ``Load``/``Store`` carries one element index into a named
buffer with a declared (row-major) shape and a scalar dtype.  A vector access has a
``Ramp`` (or any int vector) index and a vector dtype.  See docs/compiler.md.
"""
from __future__ import annotations

from .expr import (BinaryOp, Call, Cast, FloatImm, IntImm, node, PrimExpr, Var,
                   dtype_lanes, with_lanes)

FOR_KINDS = ("serial", "parallel", "vectorized", "unrolled")
#: What a kernel returns when a run-time bound check (``tir.instrument_bound_checkers``) fails.
ERR_OUT_OF_BOUNDS = 3


# --------------------------------------------------------------------------- buffers

class Buffer:
    """A named flat memory region: ``shape`` (ints or int exprs), scalar ``dtype``, ``scope``.

    Parameters of a PrimFunc are buffers with ``scope="global"`` (caller-owned);
    ``Allocate`` introduces the others.
    """

    __slots__ = ("name", "shape", "dtype", "scope", "strides")
    __hash__ = object.__hash__

    def __init__(self, name: str, shape, dtype: str = "float32", scope: str = "global",
                 strides=None):
        if dtype_lanes(dtype) != 1:
            raise TypeError(f"buffer {name}: dtype must be scalar, got {dtype}")
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.scope = scope
        #: element strides per dimension (ints) when padded by ``storage_align``; None: compact
        self.strides = None if strides is None else tuple(strides)

    @property
    def size(self):
        """Number of elements: an int when the shape is constant, else an expression."""
        if self.strides is not None and self.shape:
            first = self.shape[0]
            return (first.value if isinstance(first, IntImm) else first) * self.strides[0]
        total = 1
        for dim in self.shape:
            total = total * (dim.value if isinstance(dim, IntImm) else dim)
        return total

    def __repr__(self):
        return f"Buffer({self.name}, {self.dtype}, {list(self.shape)}, scope={self.scope})"


# --------------------------------------------------------------------------- vector exprs

@node
class Ramp(PrimExpr):
    """The int vector ``[base, base+stride, ..., base+(lanes-1)*stride]``."""

    _fields = ("base", "stride", "lanes")

    def __init__(self, base: PrimExpr, stride: PrimExpr, lanes: int):
        self.base = base
        self.stride = stride
        self.lanes = int(lanes)
        self.dtype = with_lanes(base.dtype, self.lanes)


@node
class Broadcast(PrimExpr):
    """A scalar repeated in every lane."""

    _fields = ("value", "lanes")

    def __init__(self, value: PrimExpr, lanes: int):
        self.value = value
        self.lanes = int(lanes)
        self.dtype = with_lanes(value.dtype, self.lanes)


@node
class Load(PrimExpr):
    """``buffer[index]``; dtype is the buffer's element type with the index's lanes."""

    _fields = ("buffer", "index")

    def __init__(self, buffer: Buffer, index: PrimExpr):
        self.buffer = buffer
        self.index = index
        self.dtype = with_lanes(buffer.dtype, dtype_lanes(index.dtype))


# --------------------------------------------------------------------------- statements

class Stmt:
    """Base of every statement; a statement class is declared with ``@node``."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __repr__(self):
        return stmt_to_str(self)


@node
class Store(Stmt):
    """``buffer[index] = value``; a vector index stores every lane."""

    _fields = ("buffer", "value", "index")


@node
class For(Stmt):
    """``for (var = min; var < min + extent; ++var) body`` with a loop kind.

    Lowering emits ``min == 0`` always; after the vectorize and unroll passes, loops of
    kind "vectorized" and "unrolled" that remain could not be transformed and may be
    run as serial loops.
    """

    _fields = ("var", "min", "extent", "kind", "body")

    def __init__(self, var: Var, min: PrimExpr, extent: PrimExpr, kind: str, body: Stmt):
        if kind not in FOR_KINDS:
            raise ValueError(f"unknown loop kind {kind!r}")
        self.var = var
        self.min = min
        self.extent = extent
        self.kind = kind
        self.body = body


@node
class Allocate(Stmt):
    """Storage for ``buffer`` (all of ``buffer.size`` elements) while ``body`` runs."""

    _fields = ("buffer", "body")


@node
class IfThenElse(Stmt):
    _fields = ("condition", "then_case", "else_case")
    _defaults = {"else_case": None}


@node
class LetStmt(Stmt):
    _fields = ("var", "value", "body")


@node
class SeqStmt(Stmt):
    _fields = ("seq",)
    _tuples = ("seq",)


@node
class AssertStmt(Stmt):
    """Run ``body`` if ``condition`` holds, else stop the function with an error.

    ``message`` says what failed (the interpreter raises it; compiled code returns
    ``code``, e.g. ERR_OUT_OF_BOUNDS for ``tir.instrument_bound_checkers``). In a vectorized
    loop the condition is ``Call("bool", "all_lanes", [vector condition])``.
    """

    _fields = ("condition", "message", "code", "body")


@node
class Prefetch(Stmt):
    """A hint: bring the cache line holding ``buffer[index]`` closer (TVM's prefetch).

    Never faults, even past the end of the buffer; the interpreter ignores it.
    """

    _fields = ("buffer", "index")


@node
class Evaluate(Stmt):
    _fields = ("value",)


def seq(*stmts) -> Stmt | None:
    """A SeqStmt flattened and without ``None``s; a single statement stays itself, none -> None."""
    flat = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            flat.extend(s.seq)
        else:
            flat.append(s)
    if len(flat) <= 1:
        return flat[0] if flat else None
    return SeqStmt(flat)


class PrimFunc:
    """A lowered function: ``params`` are Buffers (tensors) and Vars (scalars), in call order."""

    def __init__(self, name: str, params, body: Stmt, attrs: dict | None = None):
        self.name = name
        self.params = list(params)
        self.body = body
        self.attrs = dict(attrs or {})

    def with_body(self, body: Stmt) -> "PrimFunc":
        return PrimFunc(self.name, self.params, body, self.attrs)

    def __str__(self):
        return func_to_str(self)

    __repr__ = __str__


# --------------------------------------------------------------------------- traversal

def _rebuild(node, values):
    cls = type(node)
    if isinstance(node, BinaryOp):
        new = cls.__new__(cls)
        new.a, new.b = values
        new.dtype = node.dtype if new.a.dtype == node.a.dtype else cls._result_dtype(new.a, new.b)
        return new
    if isinstance(node, (Cast, Call)):
        return cls(node.dtype, *values[1:])
    return cls(*values)


class Mutator:
    """Rebuilds a tree bottom-up; override ``visit_<ClassName>`` to change nodes.

    Unchanged subtrees are returned as the same objects.
    """

    def visit(self, node):
        if node is None:
            return None
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            return method(node)
        return self.generic_visit(node)

    def generic_visit(self, node):
        if not isinstance(node, (PrimExpr, Stmt)) or isinstance(node, (Var, IntImm, FloatImm)):
            return node
        values, changed = [], False
        for name in node._fields:
            old = getattr(node, name)
            if isinstance(old, (PrimExpr, Stmt)):
                new = self.visit(old)
            elif isinstance(old, tuple) and name in ("args", "seq", "indices", "source", "init"):
                new = tuple(self.visit(x) for x in old)
                if all(x is y for x, y in zip(new, old)):
                    new = old
            else:
                new = old
            changed |= new is not old
            values.append(new)
        return _rebuild(node, values) if changed else node


def post_order_visit(node, fn) -> None:
    """Call ``fn`` on every expression and statement below ``node`` (children first)."""
    if isinstance(node, (PrimExpr, Stmt)):
        for name in node._fields:
            child = getattr(node, name)
            if isinstance(child, (PrimExpr, Stmt)):
                post_order_visit(child, fn)
            elif isinstance(child, tuple):
                for c in child:
                    post_order_visit(c, fn)
        fn(node)


def substitute(node, mapping: dict):
    """Replace Vars (by identity) with expressions."""
    if not mapping:
        return node

    class _Sub(Mutator):
        def visit_Var(self, v):
            return mapping.get(v, v)

    return _Sub().visit(node)


def vars_in(node) -> set:
    """Every Var that occurs below ``node``."""
    found: set = set()
    post_order_visit(node, lambda n: found.add(n) if isinstance(n, Var) else None)
    return found


def uses_var(node, var: Var) -> bool:
    return var in vars_in(node)


# --------------------------------------------------------------------------- printing

def expr_to_str(e) -> str:
    from .printer import Printer
    return Printer().expr(e)


def stmt_to_str(s, indent: str = "") -> str:
    from .printer import Printer
    return Printer().stmt(s, indent)


def func_to_str(f: PrimFunc) -> str:
    from .printer import Printer
    return Printer().func(f)
