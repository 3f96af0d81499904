"""TVM's ``tir.ir_builder`` for ``te.extern`` bodies: loops, conditions and buffer accesses.

    ib = ir_builder.create()
    a, c = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
    with ib.for_range(0, n, name="i") as i:
        c[i] = a[i] + 1.0
    body = ib.get()

``buffer_ptr(buf)[i, j]`` indexes a buffer row-major (a single index is the flat one);
reading gives a ``Load``, assigning emits a ``Store``.
"""
from __future__ import annotations

from contextlib import contextmanager

from .expr import PrimExpr, Var, convert
from .ir import BufferPointer, Evaluate, For, IfThenElse, LetStmt, Load, Store, seq, substitute

_KINDS = {"serial": "serial", "parallel": "parallel", "vectorize": "vectorized",
          "unroll": "unrolled"}


class BufferView:
    """A region of a real buffer seen as a compact ``shape`` tensor: element ``[i, j, ...]``
    is ``data[elem_offset + i * strides[0] + j * strides[1] + ...]``. Tensorize hands these
    to a tensor intrinsic's body (``te.decl_tensor_intrin``)."""

    def __init__(self, name: str, shape, dtype: str, data, elem_offset, strides):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype
        self.data = data
        self.elem_offset = convert(elem_offset)
        self.strides = tuple(convert(s) for s in strides)

    def flat_index(self, parts) -> PrimExpr:
        if len(parts) != len(self.shape):
            raise IndexError(f"{self.name} has {len(self.shape)} dimensions, "
                             f"indexed with {len(parts)}")
        flat = self.elem_offset
        for part, stride in zip(parts, self.strides):
            flat = flat + convert(part) * stride
        return flat

    def __repr__(self):
        return f"BufferView({self.name} of {self.data.name}, shape={list(self.shape)})"

    def access_ptr(self, access_mask="rw", offset=0) -> BufferPointer:
        """The address of the view's element ``offset`` (flat, in elements), for ``call_extern``."""
        return BufferPointer(self.data, self.elem_offset + convert(offset))


class BufferPtr:
    def __init__(self, builder: "IRBuilder", buffer):
        self._builder = builder
        self.buffer = buffer
        self._target = buffer.data if isinstance(buffer, BufferView) else buffer

    def _index(self, index) -> PrimExpr:
        parts = index if isinstance(index, tuple) else (index,)
        if isinstance(self.buffer, BufferView):
            return self.buffer.flat_index(parts)
        if len(parts) == 1:
            return convert(parts[0])
        if len(parts) != len(self.buffer.shape):
            raise IndexError(f"{self.buffer.name} has {len(self.buffer.shape)} dimensions, "
                             f"indexed with {len(parts)}")
        flat = convert(parts[0])
        for dim, part in zip(self.buffer.shape[1:], parts[1:]):
            flat = flat * dim + part
        return flat

    def __getitem__(self, index) -> Load:
        return Load(self._target, self._index(index))

    def __setitem__(self, index, value) -> None:
        value = convert(value)
        if value.dtype != self.buffer.dtype:
            value = value.astype(self.buffer.dtype)
        self._builder.emit(Store(self._target, value, self._index(index)))


class IRBuilder:
    def __init__(self):
        self._scopes: list[list] = [[]]

    def emit(self, stmt) -> None:
        """Append a statement; an expression (a ``call_extern``) is evaluated for its effect."""
        self._scopes[-1].append(Evaluate(stmt) if isinstance(stmt, PrimExpr) else stmt)

    def _pop(self):
        return _build(self._scopes.pop())

    @contextmanager
    def for_range(self, begin, end, name: str = "i", dtype: str = "int32", kind: str = "serial"):
        if kind not in _KINDS:
            raise ValueError(f"for_range kind must be one of {sorted(_KINDS)}, got {kind!r}")
        var = Var(name, dtype)
        self._scopes.append([])
        yield var
        body = self._pop()
        begin, end = convert(begin), convert(end)
        loop_var = Var(name, dtype)     # loops start at 0 in the IR
        self.emit(For(loop_var, convert(0), end - begin, _KINDS[kind],
                      substitute(body, {var: loop_var + begin})))

    @contextmanager
    def if_scope(self, cond):
        self._scopes.append([])
        yield
        self.emit(IfThenElse(convert(cond), self._pop()))

    @contextmanager
    def else_scope(self):
        last = self._scopes[-1].pop() if self._scopes[-1] else None
        if not isinstance(last, IfThenElse) or last.else_case is not None:
            raise ValueError("else_scope must follow an if_scope")
        self._scopes.append([])
        yield
        self.emit(IfThenElse(last.condition, last.then_case, self._pop()))

    def let(self, name: str, value) -> Var:
        """A variable bound to ``value`` for the statements that follow in this scope."""
        value = convert(value)
        var = Var(name, value.dtype)
        self.emit(("let", var, value))
        return var

    def buffer_ptr(self, buffer) -> BufferPtr:
        return BufferPtr(self, buffer)

    def get(self):
        return _build(self._scopes[0])


def _build(items):
    """The statements of a scope; a ``let`` covers the statements after it."""
    out = []
    for k, item in enumerate(items):
        if isinstance(item, tuple) and item[0] == "let":
            _, var, value = item
            out.append(LetStmt(var, value, _build(items[k + 1:])))
            return seq(*out)
        out.append(item)
    return seq(*out)


def create() -> IRBuilder:
    return IRBuilder()
