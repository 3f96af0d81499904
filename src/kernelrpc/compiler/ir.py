"""The loop-nest IR that lowering produces and code generation consumes.

Buffers are flat: every ``Load``/``Store`` carries one element index into a named
buffer with a declared (row-major) shape and a scalar dtype.  A vector access has a
``Ramp`` (or any int vector) index and a vector dtype.  See docs/compiler.md.
"""
from __future__ import annotations

import re

from .expr import (BinaryOp, Call, Cast, FloatImm, IntImm, Let, PrimExpr, Var, convert,
                   dtype_lanes, node, parse_dtype, with_lanes)

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

    def access_ptr(self, access_mask="rw", offset=0) -> "BufferPointer":
        """TVM's ``Buffer.access_ptr``: the address of element ``offset``, for ``call_extern``."""
        return BufferPointer(self, convert(offset))


# --------------------------------------------------------------------------- vector exprs

#: the largest constant stride of a ``Ramp`` index the code generator loads as contiguous
#: vectors and a shuffle; a wider stride, or an index that is no ramp, loads lane by lane
MAX_STRIDED_LOAD = 4


def gathers(index) -> bool:
    """Whether a vector load at ``index`` reads its lanes one by one (not a ramp of stride 1
    to :data:`MAX_STRIDED_LOAD`)."""
    if dtype_lanes(index.dtype) == 1:
        return False
    return not (isinstance(index, Ramp) and isinstance(index.stride, IntImm) and
                1 <= index.stride.value <= MAX_STRIDED_LOAD)


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


# --------------------------------------------------------------------------- C calls

@node
class BufferPointer(PrimExpr):
    """The address of ``buffer[offset]``: an argument of ``call_extern`` (dtype ``handle``)."""

    _fields = ("buffer", "offset")

    def __init__(self, buffer: Buffer, offset: PrimExpr):
        self.buffer = buffer
        self.offset = offset
        self.dtype = "handle"


@node
class ExternCall(PrimExpr):
    """A call of the C function ``name`` (TVM's ``tir.call_extern``).

    Not pure: passes never merge, reorder or vectorize it (a loop that calls one stays scalar).
    The function is linked into the module (``build(..., sources=, objects=)``, or the target's
    C library); ``dtype`` is its return type, ``"void"`` for none.
    """

    _fields = ("dtype", "name", "args")
    _tuples = ("args",)


_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: argument dtypes a C function can take from a kernel (unsigned 32-bit values are extended
#: differently by different C ABIs: pass them as int32 or int64)
EXTERN_ARG_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint64", "float32",
                     "float64")


def call_extern(dtype: str, name: str, *args) -> ExternCall:
    """TVM's ``tir.call_extern(dtype, "c_function", *args)``.

    ``args`` are scalar expressions (Python numbers become int32/float32) and buffers (a
    ``Buffer`` or a tensorize ``BufferView`` is the address of its first element;
    ``buf.access_ptr("r", offset)`` the address of another). ``dtype`` is what the function
    returns, ``"void"`` when nothing; a void call is a statement (``ib.emit(...)``).
    """
    from .ir_builder import BufferView

    if not isinstance(name, str) or not _C_IDENTIFIER.match(name) or name.startswith("__kernelrpc"):
        raise TypeError(f"call_extern: {name!r} is not the name of a C function")
    if dtype != "void":
        parse_dtype(dtype)
        if dtype not in EXTERN_ARG_DTYPES:
            raise TypeError(f"call_extern {name}: return type {dtype} is not one of "
                            f"{', '.join(EXTERN_ARG_DTYPES)} or void")
    converted = []
    for k, arg in enumerate(args):
        if isinstance(arg, Buffer):
            arg = BufferPointer(arg, IntImm(0))
        elif isinstance(arg, BufferView):
            arg = BufferPointer(arg.data, arg.elem_offset)
        else:
            arg = convert(arg)
        if not isinstance(arg, BufferPointer) and arg.dtype not in EXTERN_ARG_DTYPES:
            raise TypeError(f"call_extern {name}: argument {k} is {arg.dtype}; C functions take "
                            f"{', '.join(EXTERN_ARG_DTYPES)} or buffers")
        converted.append(arg)
    return ExternCall(dtype, name, converted)


def call_packed(*args, **kwargs):
    """TVM's ``tir.call_packed`` needs TVM's packed-function registry, which a kernelrpc module
    does not have: it calls C functions directly."""
    raise NotImplementedError(
        "tir.call_packed calls a function of TVM's packed-function registry, which kernelrpc "
        "modules do not have; call the C function with tir.call_extern(dtype, 'name', *args) "
        "and link it with kernelrpc.build(..., sources=[...]) or objects=[...]")


def extern_calls(node) -> list:
    """The names of the C functions ``call_extern`` calls below ``node``, in first-call order."""
    names: dict = {}
    post_order_visit(node, lambda n: names.setdefault(n.name, None)
                     if isinstance(n, ExternCall) else None)
    return list(names)


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

    def with_attr(self, key: str, value) -> "PrimFunc":
        """A copy with attribute ``key`` set (TVM's); ``global_symbol`` also renames it, as
        the symbol is the function's name in the built module."""
        attrs = {**self.attrs, key: value}
        return PrimFunc(str(value) if key == "global_symbol" else self.name, self.params,
                        self.body, attrs)

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


def bound_vars(node) -> set:
    """Every Var a loop, a ``LetStmt`` or a ``Let`` below ``node`` binds."""
    found: set = set()
    post_order_visit(node, lambda n: found.add(n.var) if isinstance(n, (For, LetStmt, Let))
                     else None)
    return found


def contains(node, types) -> bool:
    """Whether a node of ``types`` occurs below ``node`` (itself included)."""
    found = []
    post_order_visit(node, lambda n: found.append(n) if isinstance(n, types) else None)
    return bool(found)


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
